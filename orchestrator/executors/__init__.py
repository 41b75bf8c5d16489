"""Where attempts run: `tmux` (default), `subprocess`, `slurm`. See executors.base for the seam."""
