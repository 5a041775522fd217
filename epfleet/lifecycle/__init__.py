"""What a store keeps and what it costs: retiring models and targets (``retire``),
collecting what nothing references (``gc``, the pure decision in ``gc_rules``, what
device reports pin in ``gc_pins``), and bytes per model and target (``costs``). It may
import the fleet side (the manifest in force) and everything below it, never the device
engine or the CLI."""
