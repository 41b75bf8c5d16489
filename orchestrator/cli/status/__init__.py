"""`orch status` and `orch gpus`: one snapshot, rendered rich or plain."""
