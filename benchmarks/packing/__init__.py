"""Virtual-time packing benchmark: the real `orchestrator.packing.pack` raced against simple launchers."""
