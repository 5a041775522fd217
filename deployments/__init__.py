"""Prefect deployment definitions: prefect.yaml (work pools) and serve.py (one process)."""
