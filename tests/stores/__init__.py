"""Tests of epfleet.stores: the Store contract on local, S3 (moto over HTTP) and HTTPS
backends, bounded waits, cache headers."""
