"""orch: a GPU sweep orchestrator for LoRA fine-tuning jobs."""

__version__ = "0.1.0"
