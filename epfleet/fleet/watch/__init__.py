"""Runtime-watch: which published pairs are stale or missing for the compile workers'
runtime and what the devices report (``rules`` decides, ``inputs`` reads)."""
