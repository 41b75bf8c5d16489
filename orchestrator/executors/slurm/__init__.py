"""The Slurm executor: sbatch per attempt, batched squeue/sacct, the cluster's end states."""
