"""What a user asks of a sweep (cancel, retry, resume) and whether a daemon runs: called alike by
the CLI and the web page, below both and below the daemon, which only carries the requests out."""
