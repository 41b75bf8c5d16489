"""The scheduling pass: read queue, per-kind inputs, pack, claim and launch, wait reasons."""
