"""``epfleet manifest show|schema``: print the published manifest, its costs, its schema."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

from cyclopts import App, Parameter

from epfleet.cli.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from epfleet.cli.options import Json, Store, TrustRoot, command_help, did_you_mean, pin_trust_root
from epfleet.errors import BadInputError
from epfleet.logs import say
from epfleet.stores import DEFAULT_STORE
from epfleet.text import output_width

if TYPE_CHECKING:
    from epfleet.stores import Store as StoreType

manifest_app = App(name="manifest", help="Inspect the published manifest.", help_epilogue="")


@manifest_app.default
def _no_manifest_command(*unknown: Annotated[str, Parameter(show=False)]) -> int:
    what = "manifest needs a command"
    if unknown:
        near = did_you_mean(unknown[0], ("show", "schema"))
        what = f"unknown command 'manifest {unknown[0]}'{near}"
    say(f"epfleet: error: {what} (one of: show, schema)")
    return EXIT_BAD_INPUT


@manifest_app.command
def show(
    *,
    store: Store = DEFAULT_STORE,
    trust_root: TrustRoot = None,
    as_json: Json = False,
    costs: bool = False,
    field: bool = False,
) -> int:
    """Print the published manifest as a table, with what the store holds per model and
    target, or as JSON.

    For example:
      epfleet manifest show --store s3://bucket/fleet
      epfleet manifest show --store ./epfleet-store --json
      epfleet manifest show --store ./epfleet-store --json --costs
      epfleet manifest show --store s3://bucket/fleet --field

    Exit codes: 0 shown; 1 the store failed; 2 no manifest there.

    Parameters
    ----------
    as_json
        Print the manifest document itself.
    costs
        With --json: print the store's bytes per model and target, and its total
        (referenced, unreferenced, other), instead of the manifest.
    field
        Show what the device reports say of each model and target instead: devices
        running it, devices where it failed, latency p50/p95 across the fleet, devices
        where part of it runs on other EPs (reports from the store, or EPFLEET_REPORT_TO),
        counted as the rollout gate counts them: a report only under its own device's
        key, an enrolled device's newest signed report only.
    """
    from epfleet.fleet.publishing.publish import read_in_force
    from epfleet.fleet.views import render_manifest
    from epfleet.lifecycle.costs import cost_table
    from epfleet.lifecycle.costs import costs as store_costs
    from epfleet.stores import MANIFEST_KEY, open_store
    from epfleet.text import wrap

    pin_trust_root(store, trust_root)
    opened = open_store(store)
    in_force = read_in_force(opened)
    manifest = in_force.manifest
    if manifest is None:
        raise BadInputError(f"no manifest at {store}/manifest.json: run epfleet compile first")
    copy = opened.read(MANIFEST_KEY) if in_force.key != MANIFEST_KEY else None
    if in_force.key != MANIFEST_KEY and (copy is None or copy.data != manifest.to_json()):
        mismatch = (
            f"epfleet: {store}/manifest.json is not the copy of the signed manifest shown "
            "here (a publish under way, or changed by someone without the keys: the next "
            "publish or epfleet trust refresh puts it right)"
        )
        print(wrap(mismatch, output_width(sys.stderr)), file=sys.stderr)
    if field:
        return _show_field(opened, as_json)
    if as_json and costs:
        sys.stdout.write(store_costs(opened, manifest).model_dump_json(indent=2) + "\n")
    elif as_json:
        sys.stdout.write(manifest.to_json().decode())
    else:
        width = output_width()
        print(render_manifest(manifest, store, width))
        print()
        print(cost_table(opened, manifest, width))
    return EXIT_OK


@manifest_app.command
def schema() -> int:
    """Print the manifest's JSON Schema.

    For example:
      epfleet manifest schema > manifest.schema.json
    """
    from epfleet.formats.manifest import json_schema

    sys.stdout.write(json_schema())
    return EXIT_OK


def _show_field(opened: StoreType, as_json: bool) -> int:
    from epfleet.fleet.rollout.rollouts import read_evidence
    from epfleet.fleet.views import render_choices, render_field

    reading = read_evidence(opened)  # the gate's pass: its attribution and its order
    if reading.unreadable:
        say(f"epfleet: {reading.unreadable} device reports could not be read")
    if reading.unattributed:
        say(
            f"epfleet: {reading.unattributed} device reports under another device's key not counted"
        )
    if as_json:
        print(json.dumps([row.model_dump() for row in reading.field], indent=2))
    else:
        print(render_field(reading.field, reading.read, output_width()))
        print()
        print(render_choices(reading.ranking_choices, output_width()))
    return EXIT_OK


command_help(show, schema)
