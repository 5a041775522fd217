"""Which modules are pure rules: what the import and configuration tests hold to purity."""

from __future__ import annotations

DEVICE_RULES = frozenset(
    {"epfleet.device.selection", "epfleet.device.activation", "epfleet.device.jitter"}
)
"""The device engine's pure modules (named for what they decide, not ``*_rules``)."""


def is_rule_module(module: str) -> bool:
    """A rule module: named ``rules`` or ``*_rules`` (a feature's pure decisions), a
    feature's ``models`` (the plain data its rules and I/O share), or a device rule."""
    last = module.rsplit(".", 1)[-1]
    return last in ("rules", "models") or last.endswith("_rules") or module in DEVICE_RULES
