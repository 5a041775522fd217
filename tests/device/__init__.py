"""Tests of epfleet.device: real syncs, the cache under faults and deadlines, downloads,
selection and precision."""
