"""One attempt after launch: run-dir reads, observing, stdout, kills, wake, classify, outcomes, disk."""
