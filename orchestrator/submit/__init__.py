"""The first stage of a job's life: a suite × grid × pairs checked and queued (`orch submit`
and `Sweep.submit` both call `submit.core.submit_sweep`)."""
