"""Publishing to the store's manifest: read the one in force, merge a run's results
(``merge_rules``), add binary deltas, write it with compare-and-swap (``publish``)."""
