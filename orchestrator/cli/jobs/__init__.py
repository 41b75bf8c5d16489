"""`orch jobs`, `orch show`, `orch logs`."""
