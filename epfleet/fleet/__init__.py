"""The compile side: planning a fleet run against the manifest in force (``planning``, the
pure rules in ``plan_rules``), staging sources, samples and calibration inputs
(``staging``, ``calibration``), building and verifying each pair (``build``,
``verify``), turning outcomes into entries (``outcomes``), publishing them
(``publishing``, rules in ``publish_rules`` and ``merge_rules``), work-pool hand-over
(``handover``), runtime-watch (``watch_rules``, ``watch_inputs``), device reports read
as a stream (``report_reading``, for watch and gc), retries and task
runners, and the run's readable views (``views``). Pure modules are named
``*_rules``. It may import ``formats``, ``runtime``, ``stores`` and ``trust``, never the
device engine or the CLI."""
