"""Starting attempts: run dir preparation, the wrapper, and the tmux / subprocess launchers.

Kept free of imports so that the wrapper (`orchestrator/launch/wrapper.py`) starts fast.
"""
