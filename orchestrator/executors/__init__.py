"""Where attempts run: the backends named in executors.backends. See executors.base for the seam."""
