"""The compile side, by feature: each subpackage holds its pure rules (``rules`` and
``*_rules`` modules: facts, ``now`` and ids passed in; no clock, randomness, environment
or I/O) beside the I/O that feeds them.

- ``planning``: which pairs a run compiles (``plan`` reads the spec and the manifest in
  force, ``rules`` decides), calibration inputs, numerics twins (``twin_rules``).
- ``build``: staging sources and samples, compiling (``variant``), verifying
  (``verify``, its cache ``verify_cache``, the default task metric ``decision_rules``,
  rate metrics ``share_rules``).
- ``publishing``: the manifest in force read and changed by compare-and-swap
  (``publish``), what a run publishes (``rules``), how results merge (``merge_rules``),
  binary deltas (``delta_rules``, ``deltas``).
- ``runs``: one compile run's models (``models``), order of work (``compile_run``), how
  it runs (``execute``: what ``epfleet compile`` calls; ``run_way`` its choice,
  ``plain_runner``, ``task_runners``, ``handover`` to work pools, ``retries``), outcomes
  as entries (``outcomes``), runs kept for Prefect (``kept_runs``).
- ``evidence``: device reports read from the store (``reading``), attributed
  (``rules``), indexed (``index``, ``index_rules``), remembered (``heard_reports``),
  the fleet's reports as the gate, the field view and watch read them
  (``fleet_reports``), counted per variant (``field_rules``), latency ranked per hardware
  profile (``ranking_rules``) and signed for devices (``rankings``); enrolled device keys
  (``enrolment``).
- ``rollout``: staged rollouts (``rules``: start, advance, halt, revert, the gate's
  judgement; ``rollouts``: status, the gate's run, an operator's moves).
- ``watch``: runtime-watch (``rules`` decides, ``inputs`` reads, ``watching`` one pass).
- ``views``: readable tables of runs, manifests, rollouts and the field.

Where things happen:

- a stage advances: ``rollout.rollouts.run_gate`` judges and moves it with
  ``rollout.rules`` (``judge``, ``advance``);
- a report is attributed to a device: ``evidence.rules.attribute`` (every reader goes
  through it: ``evidence.reading``, ``evidence.index``);
- a device chooses its variant: ``epfleet.formats.manifest.ModelEntry.for_device`` (which
  variants a rollout shows this device) and ``epfleet.device.selection.decide`` (what it
  tries of them, from ``epfleet.device.model_sync``), the signed field ranking of its
  hardware reordering what it measured (``evidence.rankings``, signed by ``run_gate``).

It may import ``formats``, ``runtime``, ``stores`` and ``trust``, never the device engine
or the CLI."""
