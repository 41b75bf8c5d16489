"""Pure prediction: memory estimates, shape keys, families, learned peaks, the ladder, throughput."""
