"""Prefect tasks of epfleet's flows."""
