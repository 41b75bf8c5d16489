"""Virtual-time packing benchmark: the real `orchestrator.scheduling.packing.pack.pack` raced against
simple launchers."""
