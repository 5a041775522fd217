"""Tests of epfleet.trust: the signed repository, the device's trust state, and attacks on
signed distribution."""
