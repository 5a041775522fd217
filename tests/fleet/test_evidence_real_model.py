"""The evidence path end to end with a model we did not write: PaddleOCR's direction
classifier (the rapidocr-onnxruntime wheel's ch_ppocr_mobile_v2.0_cls) compiled for a QNN
HTP target and the CPU (``epfleet compile`` as it runs without a Prefect API), published
to a signed local store, synced by twenty simulated devices whose reports are the device's
own (``epfleet.device.session.sync`` uploads them, with their notices), a second build
staged, and the rollout gate run on the evidence index between full listings: each reading
agrees with a full recount and with ``epfleet rollout reindex --check``, and the gate halts
the build when the devices it reaches fail it."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.fleet.rollout.rollouts import GateReading, read_evidence, run_gate
from epfleet.formats.device_report import ModelReport
from epfleet.formats.manifest import ModelEntry
from epfleet.stores import open_store
from examples import paddle_ocr
from tests.support.paths import TESTS
from tests.support.plain_fleet import compile_spec
from tests.support.specs import write_spec
from tests.support.staged_rollout import settled_at_once  # noqa: F401 (autouse)

# one worker under pytest-xdist: the wheel's models are fetched once into tests/.cache
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("third_party")]

CACHE = TESTS / ".cache" / "rapidocr"
MODEL = "ocr-cls"
HTP = {
    "name": "sd8g3",
    "ep": "QNNExecutionProvider",
    "provider_options": {
        "backend_type": "htp",
        "htp_arch": 75,
        "soc_model": 57,
        "enable_htp_fp16_precision": 1,
    },
}
DEVICES = [f"dev-{i:03d}" for i in range(20)]
ROLLOUT = {"stages": [10, 100], "canary": ["dev-000"], "min_reports": 1, "min_hours": 0}
EVERY = 3


def publish(tmp_path: Path, source: Path, optimization: str) -> None:
    """A build of the classifier for the HTP and the CPU (the CPU's at ``optimization``:
    each level another artifact); a build after the first is staged under ``ROLLOUT``."""
    _, shape = paddle_ocr.MODELS[MODEL]
    spec = write_spec(
        tmp_path,
        [{"name": MODEL, "source": str(source), "input_shapes": {"x": shape}}],
        [HTP, {"name": "cpu", "ep": "CPUExecutionProvider", "graph_optimization": optimization}],
    )
    spec.write_text(
        spec.read_text() + "rollout:\n" + "".join(f"  {k}: {v}\n" for k, v in ROLLOUT.items())
    )
    done = compile_spec(spec, tmp_path / "store", tmp_path / "cache")
    assert done.failed == 0, [v for v in done.variants if v.status != "ok"]


def sync_all(tmp_path: Path, devices: list[str] = DEVICES) -> dict[str, ModelReport]:
    """Each device synced from the store; its report uploaded by the sync itself."""
    root = tmp_path / "store.dev-keys" / "root.json"
    found = {}
    for device in devices:
        report = sync(
            str(tmp_path / "store"),
            tmp_path / "devices" / device,
            SyncPolicy(models=[MODEL]),
            device,
            trust_root=root,
        )
        assert report.report_uploaded, report.report_error
        [found[device]] = report.models
    return found


def entry(tmp_path: Path) -> ModelEntry:
    manifest = read_in_force(open_store(str(tmp_path / "store"))).manifest
    assert manifest is not None
    return manifest.models[MODEL]


def agrees(
    tmp_path: Path, judged: GateReading, recount: GateReading, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gate's reading is the full recount made just before it (the gate's moves and
    the rankings it signs aside), and reindex --check, after it, says the index agrees."""
    unjudged = {"index", "rankings_published"}
    assert judged.model_dump(exclude=unjudged) == recount.model_dump(exclude=unjudged)
    capsys.readouterr()
    store = str(tmp_path / "store")
    assert main(["rollout", "reindex", "--check", "--store", store]) == 0
    assert "answers as a full recount does" in capsys.readouterr().out


@pytest.mark.health_in_worker  # the devices reached fail the check by its time limit
def test_a_real_models_rollout_is_judged_on_the_index_as_a_recount_judges_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    monkeypatch.setenv("EPFLEET_EVIDENCE_FULL_LISTING_EVERY", str(EVERY))
    [source] = paddle_ocr.fetch(CACHE, [MODEL]).values()
    publish(tmp_path, source, "all")
    v1 = entry(tmp_path).variants["cpu"].artifact
    assert v1 is not None and entry(tmp_path).variants[HTP["name"]].status == "ok"
    first = sync_all(tmp_path)  # no NPU here: QNN refuses the HTP variant, the CPU one runs
    assert {(r.action, r.target) for r in first.values()} == {("downloaded", "cpu")}
    store = open_store(str(tmp_path / "store"))
    recount = read_evidence(store, full=True)
    judged, moves = run_gate(store)  # no rollout yet: the index is made (a full listing)
    assert judged.index is not None and judged.index.listing == "full" and moves == []
    assert judged.read == len(DEVICES)
    agrees(tmp_path, judged, recount, capsys)

    publish(tmp_path, source, "extended")  # a second build: staged
    staged = entry(tmp_path)
    assert staged.rollout is not None and staged.rollout.state == "active"
    reached = sorted(d for d in DEVICES if staged.for_device(d) is staged)
    assert "dev-000" in reached and len(reached) < len(DEVICES)
    monkeypatch.setenv("EPFLEET_HEALTH_TIMEOUT", "0.001")  # they cannot run it in time
    failing = sync_all(tmp_path, reached)
    assert all(r.action == "failed" for r in failing.values()), failing
    monkeypatch.delenv("EPFLEET_HEALTH_TIMEOUT")
    recount = read_evidence(store, full=True)
    judged, moves = run_gate(store)
    assert judged.index is not None and judged.index.listing == "inbox"
    assert judged.index.reports_read == len(reached)  # what the notices name, no more
    [status] = judged.statuses
    assert status.evidence.new.failed == len(reached) and status.verdict.decision == "halt"
    assert [m.move for m in moves] == ["halt"]
    agrees(tmp_path, judged, recount, capsys)
    halted = entry(tmp_path).rollout
    assert halted is not None and halted.state == "halted"
