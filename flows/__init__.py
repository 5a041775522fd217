"""Prefect flows of epfleet."""
