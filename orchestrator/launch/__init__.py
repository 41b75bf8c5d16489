"""Starting attempts: run dir preparation, the wrapper, and the tmux / subprocess launchers.

Kept free of imports so that `python -m orchestrator.launch.wrapper` starts fast.
"""
