"""Staged rollouts: how a publish starts one and how it moves (``rules``, pure), and the
gate, status and operator's moves against a store (``rollouts``)."""
