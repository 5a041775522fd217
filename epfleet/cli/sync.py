"""``epfleet sync``: the device sync on the command line, once, as a flow run, or served.

Its policy options (``--model``, ``--no-recompile``, ``--recompile-suboptimal``,
``--prefer``, ``--verify``, ``--drop-unlisted``) are ``SyncPolicy``'s fields, the model
the device-sync flow takes as its ``policy``. The device engine and the flow are imported
inside the command. A process that is ``epfleet sync`` (without ``--flow`` or
``--serve``) does nothing else, and is set up for that one job: securesystemslib's
signers loaded without boto3, what it has loaded kept out of the garbage collector's
passes (``_verifier_without_boto3``, ``_collect_less``; docs/operate/fleet-scale.md).
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from cyclopts import Parameter

from epfleet.cli.options import Json, Store, command_help, options_from
from epfleet.device.policy import SyncPolicy
from epfleet.stores import DEFAULT_STORE

if TYPE_CHECKING:
    SyncOptions = SyncPolicy
else:
    SyncOptions = options_from(
        SyncPolicy,
        {
            "models": Parameter(name="--model", negative_iterable=()),
            "recompile": Parameter(negative="--no-recompile"),
            "prefer": Parameter(negative_iterable=(), consume_multiple=True),
        },
        comma_lists=("prefer",),
    )


INTERRUPTED = "epfleet: interrupted; the previous variants stay active"
INTERRUPTED_FIRST = "epfleet: interrupted before the first sync finished; nothing is half-activated"


def interrupted_message(cache: Path) -> str:
    """What a Ctrl-C leaves: the variants active before, or, in a cache that has none yet
    (no package manifest), no claim that there were any."""
    from epfleet.device.cache.layout import PACKAGE_MANIFEST

    return INTERRUPTED if (cache / PACKAGE_MANIFEST).is_file() else INTERRUPTED_FIRST


def sync(
    *,
    cache: Path,
    store: Store = DEFAULT_STORE,
    policy: Annotated[SyncOptions | None, Parameter(name="*")] = None,
    device_id: str | None = None,
    trust_root: Path | None = None,
    allow_unsigned: bool = False,
    report_to: str | None = None,
    shadow_inputs: Path | None = None,
    as_json: Json = False,
    flow: bool = False,
    serve: float | None = None,
) -> int:
    """On a device: judge the published variants here, then keep, download,
    recompile or fall back, and report to the store.

    Runs without Prefect; --flow runs it as the device-sync flow (a flow run with
    artifacts); --serve serves that flow as deployment device-sync/periodic.

    For example:
      epfleet sync --store s3://bucket/fleet --cache /var/lib/epfleet \\
        --trust-root root.json
      epfleet sync --store ./epfleet-store --cache ./epfleet-device --json
      epfleet sync --store s3://bucket/fleet --cache /var/lib/epfleet --serve 900

    Exit codes: 0 every wanted model kept, downloaded or recompiled; 1 a model
    fell back or failed; 2 bad input; 130 interrupted (Ctrl-C: nothing half-activated).

    Parameters
    ----------
    cache
        The device cache directory (an ORT model package).
    device_id
        This device's id in reports (default $EPFLEET_DEVICE_ID or the host name).
    trust_root
        The root.json of the store's signed metadata, which this device trusts (default
        $EPFLEET_TRUST_ROOT); kept in the cache on first use: later syncs do not need it.
    allow_unsigned
        With no trusted root, sync from the unsigned manifest.json (the report warns);
        default $EPFLEET_ALLOW_UNSIGNED, else refused.
    report_to
        The store this device's reports go to, when not --store: a directory or
        s3://bucket/prefix it may write to (a device behind a read-only https://
        mirror); default $EPFLEET_REPORT_TO.
    shadow_inputs
        A directory of the app's inputs for shadow runs, <model>.npz each (arrays by
        input name, a leading axis for several); they never leave the device. Default:
        the model's golden samples' inputs.
    as_json
        Print the device report as JSON.
    flow
        Run as the device-sync Prefect flow, once.
    serve
        Serve device-sync/periodic, a sync every SERVE seconds, one at a time; its
        schedule stays active when this stops.
    """
    alone = not flow and serve is None and sys.argv[1:2] == ["sync"]
    if alone:  # this process is `epfleet sync` (not a caller of main): nothing else runs in it
        gc.disable()  # until the imports are done: what they make lives as long as the process
        _verifier_without_boto3()
    from epfleet.cli.interrupts import interrupts
    from epfleet.device.views import render_device_report
    from epfleet.stores.probe import store_named_first
    from epfleet.text import output_width

    wanted = SyncPolicy.model_validate(policy.model_dump()) if policy else SyncPolicy()
    if flow or serve is not None:
        from epfleet.cli.prefect_api import api_for_a_flow_run, prefect_defaults
        from flows.device_sync import device_sync

        parameters: dict[str, Any] = {"cache": str(cache.resolve()), "store": store}
        parameters |= {"policy": wanted, "device": device_id or ""}
        if trust_root is not None:
            parameters["trust_root"] = str(trust_root.resolve())
        if allow_unsigned:
            parameters["allow_unsigned"] = True
        if report_to:  # each run of the flow (every scheduled one with --serve) gets it
            parameters["report_to"] = report_to
        if shadow_inputs is not None:
            parameters["shadow_inputs"] = str(shadow_inputs.resolve())
        with prefect_defaults():
            if serve is not None:
                device_sync.serve(
                    name="periodic",
                    interval=serve,
                    parameters=parameters,
                    pause_on_shutdown=False,  # a device that restarts keeps its schedule
                    limit=1,  # one sync of this cache at a time; late runs wait their turn
                )
                return 0
            api_for_a_flow_run(without="sync without --flow (it needs no Prefect)")
            with interrupts(interrupted_message(cache)):
                report = device_sync(**parameters)
    else:
        from epfleet.device.session import sync as sync_device
        from epfleet.device.shadow import inputs_directory
        from epfleet.logs import log_to_stderr

        if alone:
            _collect_less()

        log_to_stderr()  # progress lines on stderr, the report alone on stdout
        with (
            # the cache lock released on the way out
            interrupts(interrupted_message(cache), unwind=True),
            store_named_first(store),  # a missing store, before anything about trust
        ):
            report = sync_device(
                store,
                cache,
                wanted,
                device_id,
                trust_root=trust_root,
                allow_unsigned=allow_unsigned or None,  # unset: EPFLEET_ALLOW_UNSIGNED
                report_to=report_to,  # unset: EPFLEET_REPORT_TO
                shadow_inputs=inputs_directory(shadow_inputs) if shadow_inputs else None,
            )
    print(report.model_dump_json() if as_json else render_device_report(report, output_width()))
    return report.exit_code


def _verifier_without_boto3() -> None:
    """Load securesystemslib's signer package with boto3 hidden from it, in a process that
    only syncs, before the device's TUF client (python-tuf's metadata API) loads it.

    The package imports every KMS signer it has, and its AWS one imports boto3 when it can:
    0.2-0.4 s of CPU, most of it in a no-op sync of a local or https store, for signing with
    AWS KMS, which a device never does (it verifies, with public keys). With boto3 hidden
    (``sys.modules["boto3"] = None`` makes ``import boto3`` fail) that signer records
    boto3 as missing, and would say so if this process asked it to sign; verification is
    unchanged. The name is restored right after: an S3 store or report destination
    imports boto3 as usual. Nothing is done when either package is already loaded, so a
    process that imported boto3 or the signers for other work (a test, a worker) keeps
    them as they are.
    """
    if "boto3" in sys.modules or "securesystemslib.signer" in sys.modules:
        return
    sys.modules["boto3"] = None  # type: ignore[assignment]
    try:
        import securesystemslib.signer  # noqa: F401
    finally:
        del sys.modules["boto3"]


def _collect_less() -> None:
    """Keep what this process has loaded out of the cyclic garbage collector's passes, and
    run its young-generation passes less often, in a process that only syncs.

    A no-op sync makes few reference cycles, yet CPython's collector walks every object it
    tracks on each full pass, ~120,000 once botocore's S3 model and ORT are loaded too, two
    or three times (the last at exit), and runs a young-generation pass every 700 new
    objects: 0.15-0.3 s of a no-op sync's CPU. What is loaded by now (the app, the device
    engine, the modules they import) lives as long as the process: ``gc.freeze()`` leaves
    it out of every later pass (with any garbage the imports left, while the collector was
    off: a few objects, kept). Young passes then run every 20,000 net new container
    objects (at most a few MB of garbage waiting), full passes as before.
    """
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)
    gc.enable()


command_help(sync)
