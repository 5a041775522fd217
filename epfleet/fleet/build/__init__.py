"""Building and verifying one variant: staging its inputs, compiling, verifying on the
golden samples (and the cache of verification results) before it is uploaded."""
