"""The launch wrapper and what it alone uses.

Kept free of imports so that the wrapper (`orchestrator/executors/wrapper/run.py`) starts fast under `python -S`."""
