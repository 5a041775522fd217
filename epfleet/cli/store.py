"""``epfleet gc`` and ``epfleet retire``: the store's lifecycle on the command line.

``retire`` removes models and targets from the manifest (only those named, or with
``--spec ... --unlisted`` what the spec no longer lists); ``gc`` then lists, and with
``--delete`` removes, what no manifest entry references. The engines
(``epfleet.lifecycle.retire``, ``epfleet.lifecycle.gc``) are imported inside each command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from epfleet.cli.exit_codes import EXIT_FAILED, EXIT_OK
from epfleet.cli.options import Json, Repeatable, Store, TrustRoot, command_help, pin_trust_root
from epfleet.errors import BadInputError
from epfleet.stores import DEFAULT_STORE

if TYPE_CHECKING:
    from epfleet.formats.spec import FleetSpec
    from epfleet.lifecycle.retire import Retirement

MAX_GRACE_HOURS = 876_000.0
MAX_RETENTION_DAYS = 36_500.0
"""Past a century, a grace period or a retention window means "never" (and past a
timedelta's range, it was a traceback)."""


def gc(
    *,
    store: Store = DEFAULT_STORE,
    delete: bool = False,
    grace: float | None = None,
    retention_days: float | None = None,
    trust_root: TrustRoot = None,
    as_json: Json = False,
) -> int:
    """List the store objects nothing needs, and with --delete remove them.

    Collects variants, sources and samples no manifest entry references (superseded
    builds, retired models and targets), temp files of interrupted writes and stale
    incomplete multipart uploads; only those older than --grace, and unreferenced
    files only once the manifest in force is older than --grace (a device may still
    be downloading what the previous one referenced). Keeps every variant a device
    reported active within --retention-days, and never touches manifest.json,
    reports/, trust/, runs/ or any key it does not recognise.

    For example:
      epfleet gc --store s3://bucket/fleet
      epfleet gc --store ./epfleet-store --delete --grace 48 --json

    Exit codes: 0 listed (or removed); 1 a removal or the store failed; 2 bad input.

    Parameters
    ----------
    delete
        Remove what it lists (default: a dry run, nothing removed).
    grace
        Hours an object (and the manifest in force) must be older than to be collected
        (default EPFLEET_GC_GRACE_HOURS, else 24).
    retention_days
        Keep every variant a device reported active within this many days (default
        EPFLEET_GC_RETENTION_DAYS, else 30).
    as_json
        Print one JSON object on stdout.
    """
    from epfleet.lifecycle.gc import collect, render
    from epfleet.settings import settings
    from epfleet.stores import open_store
    from epfleet.text import output_width

    grace = settings().gc_grace_hours if grace is None else grace
    retention_days = settings().gc_retention_days if retention_days is None else retention_days
    if not 0 <= grace <= MAX_GRACE_HOURS:  # NaN too
        raise BadInputError(
            f"--grace must be 0 to {MAX_GRACE_HOURS:,.0f} hours (a century), got {grace:g}"
        )
    if not 0 <= retention_days <= MAX_RETENTION_DAYS:
        raise BadInputError(
            f"--retention-days must be 0 to {MAX_RETENTION_DAYS:,.0f} (a century), got "
            f"{retention_days:g}"
        )
    pin_trust_root(store, trust_root)
    result = collect(
        open_store(store), delete=delete, grace_hours=grace, retention_days=retention_days
    )
    if as_json:
        print(json.dumps(result.model_dump(mode="json") | {"freed": result.freed}))
    else:
        print(render(result, output_width()))
    return EXIT_FAILED if result.errors else EXIT_OK


def retire(
    *,
    store: Store = DEFAULT_STORE,
    spec: Path | None = None,
    unlisted: bool = False,
    model: Repeatable = None,
    target: Repeatable = None,
    dry_run: bool = False,
    trust_root: TrustRoot = None,
    as_json: Json = False,
) -> int:
    """Remove models or targets from the manifest: devices stop getting them, and
    epfleet gc collects their files later.

    Only what you name: --model and --target (repeatable), or with --spec and
    --unlisted every model, target and model's target the spec no longer lists, but a
    target built under a runtime whose EP release a device reported within
    EPFLEET_GC_RETENTION_DAYS (it says which it keeps).

    For example:
      epfleet retire --store s3://bucket/fleet --model old-ocr
      epfleet retire --store ./epfleet-store --spec fleet.yaml --unlisted --dry-run

    Exit codes: 0 retired (or nothing to); 1 the store failed; 2 bad input (a name
    the manifest lacks, or no choice made; nothing retired).

    Parameters
    ----------
    spec
        The fleet spec YAML, with --unlisted.
    unlisted
        Retire what --spec no longer lists.
    model
        Retire this model, all its variants (repeatable).
    target
        Retire this target from every model (repeatable).
    dry_run
        Say what would be retired; change nothing.
    as_json
        Print one JSON object on stdout.
    """
    from epfleet.lifecycle.retire import apply_retirement, releases_reported
    from epfleet.stores import open_store
    from epfleet.text import output_width, printable_lines, wrap

    if spec is not None and not unlisted:
        raise BadInputError(f"--spec {spec} needs --unlisted (retire what it no longer lists)")
    if unlisted and spec is None:
        raise BadInputError("--unlisted needs --spec: the spec whose unlisted models go")
    if spec is not None and (model or target):
        raise BadInputError("give either --spec with --unlisted, or --model/--target, not both")
    if spec is None and not (model or target):
        raise BadInputError("name what to retire: --model, --target, or --spec with --unlisted")
    pin_trust_root(store, trust_root)
    opened = open_store(store)
    done = apply_retirement(
        opened,
        spec=_spec(spec) if spec is not None else None,
        models=model or [],
        targets=target or [],
        dry_run=dry_run,
        releases=releases_reported(opened) if spec is not None else None,
    )
    if as_json:
        print(json.dumps(done.model_dump(mode="json") | {"dry_run": dry_run}))
        return EXIT_OK
    lines = retirement_lines(done, store, dry_run)
    print("\n".join(wrap(printable_lines(line), output_width()) for line in lines))
    return EXIT_OK


def retirement_lines(done: Retirement, store: str, dry_run: bool = False) -> list[str]:
    """What ``epfleet retire`` prints of a retirement: what went (or would go), what was
    kept and why, and what it leaves for ``epfleet gc``."""
    from epfleet.text import format_bytes

    verb = "would retire" if dry_run else "retired"
    lines = [f"{verb} model {name} (all its variants)" for name in done.models]
    lines += [f"{verb} variant {pair}" for pair in done.variants]
    lines += [
        f"kept target {target} (no longer in the spec): devices that reported within "
        "EPFLEET_GC_RETENTION_DAYS still run its runtime's EP release"
        for target in done.kept
    ]
    if done.empty:
        lines.append(f"nothing to retire from {store}/manifest.json (generation {done.generation})")
        return lines
    after = "" if dry_run else f"; manifest generation {done.generation}"
    lines.append(
        f"{format_bytes(done.bytes)} no longer referenced: epfleet gc collects it after "
        f"its grace period{after}"
    )
    return lines


def _spec(path: Path) -> FleetSpec:
    """The fleet spec at ``path``: YAML, read with the host extra's PyYAML (retiring by
    name, --model and --target, needs neither)."""
    from epfleet.formats.spec_file import load_spec

    return load_spec(path)


command_help(gc, retire)
