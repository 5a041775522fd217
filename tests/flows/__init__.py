"""Tests of the Prefect side: flows, tasks, deployments, task runners, UI forms."""
