"""Planning a fleet run: which pairs compile, against the manifest in force (``plan``;
the pure decision in ``rules``), calibration inputs and numerics twins."""
