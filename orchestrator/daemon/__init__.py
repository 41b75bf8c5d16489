"""The daemon: one per state.db; the loop, its state file, notifications, user actions."""
