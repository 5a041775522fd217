"""The ``device-sync`` flow: keep a device's cache supplied with the best variant of every
model for the EPs it really has.

    python flows/device_sync.py --store s3://bucket/fleet --cache /var/lib/epfleet

runs it once as a Prefect flow (Prefect's ephemeral API when no server is configured);
with ``--serve SECONDS`` it serves a ``periodic`` deployment that syncs on that
interval. ``epfleet sync`` runs the same session (``epfleet.device.session``) without
Prefect; here one session serves the whole flow run, with a task per step.
"""

# No `from __future__ import annotations` here: Prefect builds each flow's parameter model
# from its annotations when it loads the flow from this file (deployments), and string
# annotations do not resolve there.
import runpy
import sys

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.events import emit_event

from epfleet.device.policy import SyncPolicy
from epfleet.device.views import device_rows, verdict_rows
from epfleet.formats.device_report import DeviceReport
from epfleet.stores import DEFAULT_STORE
from epfleet.text import format_bytes
from tasks.sync import (
    drop_unlisted_task,
    fetch_manifest_task,
    open_sync,
    report_task,
    sync_model_task,
    wanted_models_task,
)


@flow(
    name="device-sync",
    description="Fetch the fleet manifest, judge every published variant with ONNX Runtime "
    "on this device, then keep, download, recompile or fall back, and report.",
)
def device_sync(
    cache: str,
    store: str = DEFAULT_STORE,
    policy: SyncPolicy = SyncPolicy(),  # noqa: B008 (a pydantic default is immutable enough for Prefect)
    device: str = "",
    trust_root: str = "",
    allow_unsigned: bool = False,
    report_to: str = "",
    shadow_inputs: str = "",
) -> DeviceReport:
    """Sync this device's cache with the fleet manifest.

    Args:
        cache: Device cache directory (an ORT model package).
        store: The fleet's store: a directory, file:///abs/dir or s3://bucket/prefix.
        policy: Which models (empty: every model), whether to recompile, device preference,
            re-hashing, dropping the models the manifest no longer lists.
        device: Device id in reports (empty: $EPFLEET_DEVICE_ID, else the host name).
        trust_root: The root.json of the store's signed metadata (empty:
            $EPFLEET_TRUST_ROOT, else the root kept in the cache by an earlier sync).
        allow_unsigned: With no trusted root, sync from the unsigned manifest.json (off:
            as $EPFLEET_ALLOW_UNSIGNED says, else refused).
        report_to: Where the device report goes, when not the store (empty:
            $EPFLEET_REPORT_TO, else the store).
        shadow_inputs: A directory of the app's inputs for shadow runs, <model>.npz each
            (empty: the golden samples' inputs).
    """
    # The lock, state, discovery and worker: once per run. Empty means "as configured".
    with open_sync(
        store,
        cache,
        policy,
        device or None,
        trust_root or None,
        allow_unsigned or None,
        report_to or None,
        shadow_inputs or None,
    ):
        fetch_manifest_task(cache)
        drop_unlisted_task(cache)
        for model in wanted_models_task(cache):
            sync_model_task(cache, model)
        report = report_task(cache)
    _publish_artifacts(report)
    if report.report_uploaded:  # the rollout-gate deployment's trigger
        emit_event(
            event="epfleet.device.reported",
            resource={
                "prefect.resource.id": f"epfleet.device.{report.device_id}",
                "prefect.resource.name": report.device_id,
                "epfleet.store": store,
            },
            payload={"served": report.served, "models": len(report.models)},
        )
    get_run_logger().info("%d of %d models served", report.served, len(report.models))
    return report


def _publish_artifacts(report: DeviceReport) -> None:
    key = f"device-sync-{report.device_id}".replace(".", "-").replace("_", "-")
    create_table_artifact(
        key=key,
        table=device_rows(report),
        description=f"What device {report.device_id} runs, and why",
    )
    create_table_artifact(
        key=f"{key}-verdicts",
        table=verdict_rows(report),
        description=f"How device {report.device_id} judged each published variant",
    )
    moved = sum(m.bytes_downloaded for m in report.models)
    signed = report.manifest.signed
    generation = report.manifest.generation
    shown = [f"generation {generation}"] if generation is not None else []
    shown += [] if signed is None else ["signed" if signed else "unsigned"]
    details = f" ({', '.join(shown)})" if shown else ""
    create_markdown_artifact(
        key=f"{key}-summary",
        markdown=(
            f"**{report.device_id}**: manifest {report.manifest.status}{details} · "
            f"{format_bytes(moved)} downloaded · "
            + ", ".join(f"`{m.model}` {m.action}" for m in report.models)
            + "\n\n"
            + "\n".join(
                f"- `{m.model}` {m.action}: {m.reason}" for m in report.models if not m.served
            )
        ),
    )


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it:
    # the CLI imports the flows, so a flow importing the CLI would close a circle.
    sys.argv[1:1] = ["sync", "--flow", "--json"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
