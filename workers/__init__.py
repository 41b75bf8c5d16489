"""Worker programs orch launches. They speak the file protocol only and never import orchestrator."""
