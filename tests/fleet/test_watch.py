"""runtime-watch's decisions (pure): stale and missing pairs, unserved device profiles."""

from __future__ import annotations

from datetime import timedelta

import pytest

from epfleet.fleet.watch.rules import UnservedProfile, WatchPlan, check_pairs, find_unserved
from epfleet.formats.device_report import DeviceReport, VariantVerdict
from epfleet.formats.manifest import (
    FailedBuild,
    Manifest,
)
from epfleet.formats.spec_file import parse_spec
from eps.base import Verdict
from tests.support.watch_fleet import (
    CPU,
    NOW,
    QNN,
    RUNTIME,
    SPEC,
    current_fleet,
    variant,
)
from tests.support.watch_fleet import watch_report as report

pytestmark = pytest.mark.fast


def statuses(m: Manifest | None) -> dict[tuple[str, str], str]:
    return {(c.model, c.target): c.status for c in check_pairs(SPEC, m, RUNTIME)}


def test_current_fleet_needs_nothing() -> None:
    got = statuses(current_fleet())
    assert got[("det", "sd8g3-htp")] == "current"
    # a pool-bound target's versions live on that pool: never called stale from here
    assert got[("det", "cloud-gpu")] == "unknown"
    assert "stale" not in got.values() and "missing" not in got.values()


def test_older_ep_version_is_stale_and_names_both_versions() -> None:
    fleet = current_fleet()
    fleet.models["det"].variants["sd8g3-htp"] = variant(QNN, ep_version="2.6.0")
    checks = {(c.model, c.target): c for c in check_pairs(SPEC, fleet, RUNTIME)}
    stale = checks[("det", "sd8g3-htp")]
    assert stale.status == "stale" and stale.needs_compile
    assert "onnxruntime-qnn 2.6.0 -> 2.7.0" in stale.reason
    assert checks[("cls", "sd8g3-htp")].status == "current"


def test_older_ort_makes_every_local_pair_stale() -> None:
    fleet = current_fleet()
    for entry in fleet.models.values():
        for name, v in entry.variants.items():
            entry.variants[name] = v.model_copy(update={"ort_version": "1.31.0"})
    got = statuses(fleet)
    assert [k for k, s in got.items() if s == "stale"] == [
        ("det", "sd8g3-htp"),
        ("det", "x86-cpu"),
        ("cls", "sd8g3-htp"),
        ("cls", "x86-cpu"),
    ]


def test_missing_pairs_and_no_manifest() -> None:
    fleet = current_fleet()
    del fleet.models["cls"].variants["x86-cpu"]
    assert statuses(fleet)[("cls", "x86-cpu")] == "missing"
    assert set(statuses(None).values()) == {"missing"}


def test_failed_with_same_versions_is_not_retried_but_with_new_ones_is() -> None:
    fleet = current_fleet()
    fleet.models["det"].variants["sd8g3-htp"] = variant(QNN, status="failed")
    fleet.models["cls"].variants["sd8g3-htp"] = variant(QNN, ep_version="2.6.0", status="failed")
    checks = {(c.model, c.target): c for c in check_pairs(SPEC, fleet, RUNTIME)}
    assert checks[("det", "sd8g3-htp")].status == "failing"
    assert "QNN said no" in checks[("det", "sd8g3-htp")].reason
    assert checks[("cls", "sd8g3-htp")].status == "stale"


def test_an_older_build_kept_beside_a_failure_with_the_same_versions_is_not_retried() -> None:
    fleet = current_fleet()
    older = variant(QNN, ep_version="2.6.0")
    failed = FailedBuild(
        fingerprint="f2",
        error="verification failed: output 0 differs",
        compiled_at=NOW,
        ort_version="1.32.0",
        ep_version="2.7.0",
    )
    fleet.models["det"].variants["sd8g3-htp"] = older.model_copy(update={"failed_build": failed})
    fleet.models["cls"].variants["sd8g3-htp"] = older  # no failure recorded: stale
    checks = {(c.model, c.target): c for c in check_pairs(SPEC, fleet, RUNTIME)}
    assert checks[("det", "sd8g3-htp")].status == "failing"
    assert checks[("det", "sd8g3-htp")].reason == (
        "failed with these very versions (an older build stays): verification failed: "
        "output 0 differs"
    )
    assert checks[("cls", "sd8g3-htp")].status == "stale"


def test_uninstalled_ep_is_unknown_not_stale_even_after_an_ort_upgrade() -> None:
    """A compile started from here could not build it, so nothing is triggered for it."""
    runtime = RUNTIME.model_copy(
        update={"ort_version": "1.33.0", "ep_versions": {QNN: None, CPU: "1.32.0"}}
    )
    checks = {(c.model, c.target): c for c in check_pairs(SPEC, current_fleet(), runtime)}
    assert checks[("det", "sd8g3-htp")].status == "unknown"
    assert checks[("det", "x86-cpu")].status == "stale"


def test_compile_subset_covers_every_pair_to_compile() -> None:
    fleet = current_fleet()
    fleet.models["det"].variants["sd8g3-htp"] = variant(QNN, ep_version="2.6.0")
    del fleet.models["cls"].variants["x86-cpu"]
    plan = WatchPlan(pairs=check_pairs(SPEC, fleet, RUNTIME), unserved=[], reports_read=0)
    assert plan.compile_subset() == (["cls", "det"], ["sd8g3-htp", "x86-cpu"])


def unserved(reports: list[DeviceReport], fleet: Manifest | None = None):
    checks = check_pairs(SPEC, fleet or current_fleet(), RUNTIME)
    return find_unserved(reports, SPEC, checks, RUNTIME, NOW, timedelta(days=30))


def test_devices_without_a_target_for_their_ep_form_one_unserved_profile() -> None:
    ov = [("OpenVINOExecutionProvider", "npu", 0x8086), (CPU, "cpu", 0x8086)]
    profiles, quiet = unserved(
        [
            report("pc-1", ov, {"det": "fallback", "cls": "kept"}),
            report("pc-2", ov, {"det": "recompiled"}),
            report("phone", [(QNN, "npu", 0x5143)], {"det": "kept", "cls": "downloaded"}),
        ]
    )
    assert quiet == 0
    assert len(profiles) == 1
    profile = profiles[0]
    assert profile.devices == ["pc-1", "pc-2"] and list(profile.models) == ["det"]
    assert profile.device_count == 2
    # the CPU targets match the CPU EP they also have; the reason names the accelerator
    assert profile.targets == ["cloud-gpu", "x86-cpu"]
    assert "OpenVINOExecutionProvider" in profile.label
    assert profile.models["det"].startswith("no target in the spec for OpenVINOExecutionProvider")


def test_no_target_at_all_is_named_in_the_reason() -> None:
    profiles, _ = unserved(
        [report("npu-box", [("OpenVINOExecutionProvider", "npu", 0x8086)], {"det": "fallback"})]
    )
    assert profiles[0].targets == []
    assert "no target in the spec for OpenVINOExecutionProvider" in profiles[0].models["det"]


def test_current_variants_judged_not_optimal_name_the_newer_device_runtime() -> None:
    considered = [
        VariantVerdict(
            target="sd8g3-htp",
            ep=QNN,
            device="npu",
            verdict=Verdict.PREFER_RECOMPILATION,
            reason="",
        )
    ]
    profiles, _ = unserved(
        [
            report(
                "phone",
                [(QNN, "npu", 0x5143)],
                {"det": "recompiled"},
                considered=considered,
                ep_packages={"onnxruntime-qnn": "2.8.0"},
            )
        ]
    )
    why = profiles[0].models["det"]
    assert "sd8g3-htp: prefer_recompilation" in why
    assert "onnxruntime-qnn 2.8.0 on the device, 2.7.0 on the compile workers" in why


def test_a_device_whose_pair_will_be_compiled_is_not_unserved() -> None:
    fleet = current_fleet()
    del fleet.models["det"].variants["sd8g3-htp"]
    profiles, _ = unserved([report("phone", [(QNN, "npu", 0x5143)], {"det": "fallback"})], fleet)
    assert profiles == []


def test_old_reports_are_ignored() -> None:
    old = report(
        "gone",
        [("OpenVINOExecutionProvider", "npu", 1)],
        {"det": "fallback"},
        age=timedelta(days=31),
    )
    profiles, quiet = unserved([old])
    assert profiles == [] and quiet == 1


def test_a_report_without_utc_offset_is_skipped_by_the_reader(tmp_path) -> None:
    from epfleet.fleet.watch.inputs import read_reports
    from epfleet.stores import open_store

    store = open_store(str(tmp_path / "store"))
    good = report("ok", [(CPU, "cpu", 1)], {"det": "kept"})
    naive = good.model_copy(update={"device_id": "naive", "generated_at": "2026-11-29T10:00:00"})
    store.write("reports/devices/ok.json", good.model_dump_json().encode())
    store.write("reports/devices/naive.json", naive.model_dump_json().encode())
    store.write("reports/devices/junk.json", b"{not json")
    reports, skipped = read_reports(store)
    assert [r.device_id for r in reports] == ["ok"]
    assert len(skipped) == 2
    assert any(
        "naive.json: generated_at '2026-11-29T10:00:00' has no UTC offset" in s for s in skipped
    )


def test_a_pending_cpu_compile_does_not_hide_a_refused_npu_variant() -> None:
    fleet = current_fleet()
    del fleet.models["det"].variants["x86-cpu"]  # missing: the watch will compile it
    considered = [
        VariantVerdict(
            target="sd8g3-htp", ep=QNN, device="npu", verdict=Verdict.UNSUPPORTED, reason=""
        )
    ]
    phone = report(
        "phone",
        [(QNN, "npu", 0x5143), (CPU, "cpu", 0x51)],
        {"det": "recompiled"},
        considered=considered,
    )
    profiles, _ = unserved([phone], fleet)
    assert [p.devices for p in profiles] == [["phone"]]
    assert "sd8g3-htp: unsupported" in profiles[0].models["det"]


def test_a_target_for_another_device_of_the_same_ep_does_not_serve_the_npu() -> None:
    ov = "OpenVINOExecutionProvider"
    spec = parse_spec(
        {
            "models": [{"name": "det", "source": "det.onnx"}],
            "targets": [{"name": "ov-cpu", "ep": ov, "device": "cpu"}],
        }
    )
    runtime = RUNTIME.model_copy(
        update={"ep_versions": {ov: "1.8.1"}, "ep_packages": {ov: "onnxruntime-ep-openvino"}}
    )
    pc = report("pc", [(ov, "npu", 0x8086), (ov, "cpu", 0x8086)], {"det": "fallback"})
    checks = check_pairs(spec, None, runtime)  # ov-cpu missing: the watch will compile it
    profiles, _ = find_unserved([pc], spec, checks, runtime, NOW, timedelta(days=30))
    assert [p.devices for p in profiles] == [["pc"]]
    assert (
        profiles[0]
        .models["det"]
        .startswith("no target in the spec for OpenVINOExecutionProvider npu")
    )


def test_a_variant_of_the_specs_runtime_is_not_stale_against_the_workers_versions() -> None:
    """A pair built under one of the spec's runtimes follows that runtime, not the compile
    workers' own packages: an older onnxruntime-qnn there triggers no recompile."""
    spec = parse_spec(
        {
            "models": [{"name": "det", "source": "det.onnx"}],
            "runtimes": {"qnn-2.5": ["onnxruntime==1.32.0", "onnxruntime-qnn==2.5.0"]},
            "targets": [
                {"name": "sd8g3-htp", "ep": QNN, "provider_options": {"soc_model": 57},
                 "runtimes": ["qnn-2.5"]},
            ],
        }
    )  # fmt: skip
    fleet = current_fleet()
    fleet.models["det"].variants["sd8g3-htp.qnn-2.5"] = variant(QNN, ep_version="2.5.0")
    (check,) = check_pairs(spec, fleet, RUNTIME)
    assert (check.target, check.status) == ("sd8g3-htp.qnn-2.5", "current")
    assert not check.needs_compile


def test_a_device_on_a_release_no_runtime_of_the_spec_builds_with_is_unserved() -> None:
    """The spec builds its HTP target under onnxruntime-qnn 2.5.0 and 2.7.0: a device on
    2.6.0 is named (served or not: it runs a binary of another release), one on 2.5.0 is
    not, and a spec without runtimes judges as before."""
    from epfleet.fleet.watch.inputs import spec_releases

    spec = parse_spec(
        {
            "models": [{"name": "det", "source": "det.onnx"}],
            "runtimes": {
                "qnn-2.5": ["onnxruntime==1.32.0", "onnxruntime-qnn==2.5.0"],
                "qnn-2.7": ["onnxruntime==1.32.0", "onnxruntime-qnn==2.7.0"],
            },
            "targets": [
                {"name": "htp", "ep": QNN, "provider_options": {"soc_model": 57},
                 "runtimes": ["qnn-2.5", "qnn-2.7"]},
            ],
        }
    )  # fmt: skip
    releases = spec_releases(spec, RUNTIME.ep_packages)
    assert releases == {QNN: {"qnn-2.5": "2.5.0", "qnn-2.7": "2.7.0"}}
    runtime = RUNTIME.model_copy(update={"spec_releases": releases})
    npu = [(QNN, "npu", 0x5143)]
    on_2_6 = report("d-26", npu, {"det": "downloaded"}, ep_packages={"onnxruntime-qnn": "2.6.0"})
    on_2_5 = report("d-25", npu, {"det": "downloaded"}, ep_packages={"onnxruntime-qnn": "2.5.0"})
    unserved, _ = find_unserved(
        [on_2_6, on_2_5], spec, check_pairs(spec, None, runtime), runtime, NOW, timedelta(days=7)
    )
    (profile,) = unserved
    assert profile.devices == ["d-26"] and profile.device_count == 1
    assert profile.label.endswith("; onnxruntime-qnn 2.6.0")
    assert profile.models["det"] == (
        "runs onnxruntime-qnn 2.6.0, which none of the spec's runtimes builds with "
        "(qnn-2.5: 2.5.0, qnn-2.7: 2.7.0): add a runtime for it, or move the device to one "
        "of them"
    )
    plain, _ = find_unserved([on_2_6], SPEC, check_pairs(SPEC, None, RUNTIME), RUNTIME, NOW,
                             timedelta(days=7))  # fmt: skip
    assert plain == []


def test_forged_releases_group_into_one_profile_that_names_none_of_them() -> None:
    """A device writes its own report: a release that is no version (an escape sequence,
    100,000 characters) makes no profile, label or event of its own."""
    from epfleet.fleet.watch.inputs import spec_releases

    spec = parse_spec(
        {
            "models": [{"name": "det", "source": "det.onnx"}],
            "runtimes": {"qnn-2.5": ["onnxruntime==1.32.0", "onnxruntime-qnn==2.5.0"]},
            "targets": [
                {"name": "htp", "ep": QNN, "provider_options": {"soc_model": 57},
                 "runtimes": ["qnn-2.5"]},
            ],
        }
    )  # fmt: skip
    runtime = RUNTIME.model_copy(update={"spec_releases": spec_releases(spec, RUNTIME.ep_packages)})
    npu = [(QNN, "npu", 0x5143)]
    forged = ["\x1b[2J2.5.1", "9" * 100_000, "v" + "1." * 30 + "0", "not a version"]
    reports = [
        report(f"d-{n}", npu, {"det": "downloaded"}, ep_packages={"onnxruntime-qnn": release})
        for n, release in enumerate(forged)
    ]
    reports.append(
        report("d-real", npu, {"det": "downloaded"}, ep_packages={"onnxruntime-qnn": "2.06"})
    )
    reports.append(  # the spec's own release, in another spelling
        report("d-ok", npu, {"det": "downloaded"}, ep_packages={"onnxruntime-qnn": " 2.5.0\n"})
    )
    unserved, _ = find_unserved(
        reports, spec, check_pairs(spec, None, runtime), runtime, NOW, timedelta(days=7)
    )
    by_label = {p.label.rsplit("; ", 1)[1]: p for p in unserved}
    assert set(by_label) == {"onnxruntime-qnn an unreadable version", "onnxruntime-qnn 2.6"}
    assert by_label["onnxruntime-qnn an unreadable version"].device_count == len(forged)
    assert all(len(p.profile_id) < 80 and p.profile_id.isprintable() for p in unserved)
    assert not any("d-ok" in p.devices for p in unserved)


def test_a_pass_emits_events_for_the_largest_profiles_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forged reports can make any number of profiles: a pass emits at most
    ``MAX_UNSERVED_EVENTS``, the most devices first (the real emit is run end to end in
    tests/flows/test_deployments.py)."""
    import tasks.events as events

    emitted: list[str] = []
    monkeypatch.setattr(
        events,
        "emit_event",
        lambda **event: emitted.append(event["resource"]["prefect.resource.name"]),
    )
    profiles = [
        UnservedProfile(
            profile_id=f"p{n}", label=f"p{n}", eps=[QNN], devices=[], device_count=n,
            models={}, targets=[],
        )
        for n in range(events.MAX_UNSERVED_EVENTS + 30)
    ]  # fmt: skip
    assert events.emit_unserved_events(profiles, "s3://b/p") == 30
    assert len(emitted) == events.MAX_UNSERVED_EVENTS
    assert set(emitted) == {f"p{n}" for n in range(30, events.MAX_UNSERVED_EVENTS + 30)}
