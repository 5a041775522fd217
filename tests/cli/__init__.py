"""Tests of epfleet.cli: commands in process and in subprocesses, renderings, operator errors,
interrupts and Prefect's temporary API."""
