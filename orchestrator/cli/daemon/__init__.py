"""`orch daemon start|stop|status|run`, and how they set the daemon up (options, backend, executor)."""
