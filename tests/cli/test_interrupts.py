"""Ctrl-C and SIGKILL of `epfleet compile`: one line, exit 130, nothing half-published, and
no process of the run left behind; and what killed runs leave in the worker cache is
removed by the next run. Ctrl-C of `epfleet sync` while it fetches the manifest, downloads
a variant or health-checks one: exit 130, one line, the lock released, the previous
variants active and running, no temporary file left."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from epfleet.fleet.build.staging import TEMP_GRACE_SECONDS, tidy_cache
from epfleet.formats.manifest import Manifest
from epfleet.fsutil import is_temp_name
from epfleet.trust.layout import METADATA_KEYS
from tests.support.paths import REPO
from tests.support.processes import processes_with
from tests.support.s3proxy import FaultProxy
from tests.support.specs import HTP_TARGETS, tiny_models, write_spec
from tests.support.synced_fleet import (
    assert_package_runs,
    copy_store,
    publish_to_s3,
    republish_edited_cpu_variant,
    republished_to_s3,
    run_sync,
    runaway,
)
from tests.support.trust_helpers import provisioned_root

pytestmark = pytest.mark.slow


def wait_for(condition: Callable[[], object], seconds: float, what: str) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds:g} s: {what}")


class Lines:
    """A pipe's lines as they come, read by a thread."""

    def __init__(self, pipe: object) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: object) -> None:
        for line in pipe:  # type: ignore[attr-defined]
            self.lines.append(line.rstrip("\n"))

    def done(self, seconds: float) -> list[str]:
        self._thread.join(seconds)
        return self.lines


def start_compile(tmp_path: Path, model_dir: Path) -> tuple[subprocess.Popen[str], str, Path]:
    """`python -m epfleet compile --prefect temporary` of 2 models × 8 HTP targets on the
    temporary Prefect API (asked for: without it, no API would start to interrupt),
    in a process group of its own; returns it, its cache marker and its store."""
    targets = [
        {**target, "name": f"{target['name']}-{k}"} for k in range(4) for target in HTP_TARGETS
    ]
    spec = write_spec(tmp_path, tiny_models(model_dir), targets)
    store = tmp_path / "store"
    cache = tmp_path / f"cache-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"EPFLEET_CACHE": str(cache), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env["PYTHONPATH"] = str(REPO)
    cli = subprocess.Popen(
        [
            *(sys.executable, "-m", "epfleet", "compile", str(spec)),
            *("--store", str(store), "--prefect", "temporary"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    return cli, f"EPFLEET_CACHE={cache}", store


def compiling(cli: subprocess.Popen[str], marker: str, stderr: Lines) -> bool:
    """The compiles started (the progress line is out) and a worker of the CLI runs."""
    started = any("pairs (model × target) to compile" in line for line in stderr.lines)
    return started and cli.poll() is None and any(p != cli.pid for p in processes_with(marker))


def assert_manifest_absent_or_valid(store: Path) -> None:
    manifest = store / "manifest.json"
    if manifest.exists():
        Manifest.model_validate(json.loads(manifest.read_bytes()))


def kill_group(cli: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(cli.pid, signal.SIGKILL)


def worker_starting(marker: str) -> bool:
    """A spawned worker of the run is still starting up: it has not ignored SIGINT yet."""
    for pid in processes_with(marker):
        with contextlib.suppress(OSError, IndexError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                status = Path(f"/proc/{pid}/status").read_text()
                ignored = int(status.split("SigIgn:")[1].split()[0], 16)
                if not ignored & (1 << (signal.SIGINT - 1)):
                    return True
    return False


def api_serving(marker: str) -> bool:
    """The run's temporary Prefect API (uvicorn) has started."""
    for pid in processes_with(marker):
        with contextlib.suppress(OSError):
            if b"uvicorn" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
    return False


@pytest.mark.parametrize(
    ("to_group", "with_api"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["kill-compiling", "terminal-compiling", "kill-api-up", "terminal-api-up"],
)
def test_ctrl_c_stops_a_compile_at_once(
    tmp_path: Path, model_dir: Path, to_group: bool, with_api: bool
) -> None:
    """SIGINT to the CLI alone (kill) or to its whole process group (a terminal's Ctrl-C),
    once compiles run, or once the temporary Prefect API is up too."""
    cli, marker, store = start_compile(tmp_path, model_dir)
    stderr = Lines(cli.stderr)
    try:
        wait_for(lambda: compiling(cli, marker, stderr), 120, "a compile worker started")
        if with_api:
            wait_for(lambda: api_serving(marker), 120, "the temporary API started")
        interrupt_and_check(cli, marker, store, stderr, to_group)
    finally:
        kill_group(cli)


def test_terminal_ctrl_c_while_a_worker_starts_up(tmp_path: Path, model_dir: Path) -> None:
    """A terminal's Ctrl-C reaches every worker, also one still importing: it must neither
    print a traceback nor outlive the CLI."""
    cli, marker, store = start_compile(tmp_path, model_dir)
    stderr = Lines(cli.stderr)
    try:
        wait_for(lambda: worker_starting(marker), 120, "a worker starting up")
        interrupt_and_check(cli, marker, store, stderr, to_group=True)
    finally:
        kill_group(cli)


def interrupt_and_check(
    cli: subprocess.Popen[str], marker: str, store: Path, stderr: Lines, to_group: bool
) -> None:
    sent = time.monotonic()
    if to_group:
        os.killpg(cli.pid, signal.SIGINT)
    else:
        cli.send_signal(signal.SIGINT)
    try:
        cli.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail("the CLI did not exit within 15 s of SIGINT")
    print(f"SIGINT to exit: {time.monotonic() - sent:.2f} s")
    lines = stderr.done(10)
    assert cli.returncode == 130, "\n".join(lines)
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    ours = [
        line
        for line in lines
        if line.startswith("epfleet")
        and "pairs (model × target) to compile" not in line
        and not line.startswith("epfleet: planning ")  # the first line, before the plan
        and " × " not in line  # a pair's progress line
        and "Prefect's temporary API" not in line  # its start, said before the compiles
    ]
    # (an EP's native banner from a worker may come before it: not epfleet's output)
    assert ours == ["epfleet: interrupted; compiles stopped, nothing half-published"], lines
    assert_manifest_absent_or_valid(store)
    wait_for(lambda: not processes_with(marker), 10, f"no process left: {marker}")


def test_sigkill_of_the_cli_leaves_no_process(tmp_path: Path, model_dir: Path) -> None:
    cli, marker, store = start_compile(tmp_path, model_dir)
    stderr = Lines(cli.stderr)
    try:
        wait_for(lambda: compiling(cli, marker, stderr), 120, "a compile worker started")
        wait_for(lambda: api_serving(marker), 120, "the temporary API started")
        cli.kill()  # the CLI alone: its workers and temporary API are not signalled
        cli.wait(10)
        wait_for(lambda: not processes_with(marker), 15, f"no process left: {marker}")
        assert_manifest_absent_or_valid(store)
    finally:
        kill_group(cli)
        cli.wait()


def test_the_next_run_removes_what_killed_runs_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("EPFLEET_CACHE", str(cache))
    sources, variants = cache / "sources", cache / "work" / "variants"
    sources.mkdir(parents=True)
    (variants / "m.t.abc").mkdir(parents=True)
    (variants / "m.t.abc" / "raw.onnx").write_bytes(b"x" * 10)
    old_part = sources / f".{'a' * 64}.onnx.1.2.part"
    old_tmp = sources / f".{'b' * 64}.onnx.abcdefgh.tmp"
    fresh_part = sources / f".{'c' * 64}.onnx.3.4.part"
    for path in (old_part, old_tmp, fresh_part):
        path.write_bytes(b"y" * 10)
    now = time.time()
    old = now - TEMP_GRACE_SECONDS - 60
    for path in (old_part, old_tmp, variants / "m.t.abc" / "raw.onnx", variants / "m.t.abc"):
        os.utime(path, (old, old))
    # Kept files: three sources of 100 bytes, used an hour, a day and a week ago.
    kept = {age: sources / f"{age:064d}.onnx" for age in (3600, 86400, 604800)}
    for age, path in kept.items():
        path.write_bytes(b"z" * 100)
        os.utime(path, (now - age, now - age))
    monkeypatch.setenv("EPFLEET_CACHE_MAX_BYTES", "250")
    tidy_cache()
    assert not old_part.exists() and not old_tmp.exists()
    assert not (variants / "m.t.abc").exists()
    assert fresh_part.exists()  # a run in progress may still be writing it
    assert kept[3600].exists() and kept[86400].exists()
    assert not kept[604800].exists()  # least recently used first


# --- epfleet sync ---------------------------------------------------------------------------

SYNC_MODEL = "tiny-cls"
SYNC_INTERRUPTED = "epfleet: interrupted; the previous variants stay active"


def start_sync(store: str, cache: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """`python -m epfleet sync` of one model, in a process group of its own (as a
    terminal runs it); returns it and the marker of its processes."""
    marker_dir = tmp_path / f"marker-{uuid.uuid4().hex}"
    env = dict(os.environ, EPFLEET_CACHE=str(marker_dir), PYTHONPATH=str(REPO))
    root = provisioned_root(store)
    cli = subprocess.Popen(
        [
            *(sys.executable, "-m", "epfleet", "sync", "--store", store, "--cache", str(cache)),
            *("--model", SYNC_MODEL, "--no-recompile"),
            *(("--trust-root", str(root)) if root is not None else ()),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    return cli, f"EPFLEET_CACHE={marker_dir}"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def health_check_spinning(cli: subprocess.Popen[str], marker: str) -> bool:
    """A worker of the sync has run the runaway variant for a while."""
    for pid in processes_with(marker):
        with contextlib.suppress(OSError, IndexError):
            if pid != cli.pid and cpu_seconds(pid) > 2:
                return True
    return False


@pytest.mark.health_in_worker  # a runaway check: in-thread it has no time limit and never ends
@pytest.mark.parametrize("point", ["manifest", "download", "health-check"])
def test_ctrl_c_stops_a_sync(
    unsigned_allowed: None,  # the health check's store is unsigned, to publish a variant by hand
    fleet_store: Path,
    s3_bucket: str,
    s3_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
) -> None:
    """A terminal's Ctrl-C while the manifest fetch stalls, while a download trickles, or
    while a health check runs forever."""
    cache = tmp_path / "device"
    if point == "health-check":
        store = copy_store(fleet_store, tmp_path / "store")
        shutil.rmtree(store.with_name("store.dev-keys"), ignore_errors=True)  # unsigned
        uri = str(store)
        good = run_sync(uri, cache, models=[SYNC_MODEL])
        republish_edited_cpu_variant(store, runaway)  # its health check never ends
    else:
        good = run_sync(publish_to_s3(fleet_store, s3_bucket), cache, models=[SYNC_MODEL])
        uri, artifact = republished_to_s3(fleet_store, tmp_path, s3_bucket)
        if point == "manifest":
            watched = f"/{s3_bucket}/fleet/{METADATA_KEYS}timestamp.json"
            s3_proxy.stall_next_get_responses(watched)
        else:
            watched = artifact
            s3_proxy.trickle_next_get_responses(artifact, interval=0.5, after=1000)
    [before] = good.models
    assert before.action == "downloaded" and before.variant

    seen_before = len(s3_proxy.seen(watched)) if point != "health-check" else 0
    cli, marker = start_sync(uri, cache, tmp_path)
    stderr = Lines(cli.stderr)
    try:
        if point == "health-check":
            wait_for(lambda: health_check_spinning(cli, marker), 120, "the health check runs")
        else:
            got = lambda: len(s3_proxy.seen(watched)) > seen_before  # noqa: E731
            wait_for(got, 120, f"the sync's GET of {watched}")
            time.sleep(1)  # inside the read
        sent = time.monotonic()
        os.killpg(cli.pid, signal.SIGINT)
        try:
            cli.wait(15)
        except subprocess.TimeoutExpired:
            pytest.fail("the sync did not exit within 15 s of SIGINT")
        print(f"SIGINT to exit: {time.monotonic() - sent:.2f} s")
    finally:
        kill_group(cli)
    lines = stderr.done(10)
    assert cli.returncode == 130, "\n".join(lines)
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    assert lines.count(SYNC_INTERRUPTED) == 1 and lines[-1] == SYNC_INTERRUPTED, lines
    wait_for(lambda: not processes_with(marker), 10, f"no process left: {marker}")
    temporary = [p for p in cache.rglob("*") if is_temp_name(p.name)]
    assert temporary == [], temporary
    assert_package_runs(cache, {SYNC_MODEL: before.variant})
    monkeypatch.setenv("EPFLEET_HEALTH_TIMEOUT", "2")  # the runaway variant again
    after = run_sync(uri, cache, models=[SYNC_MODEL], recompile=False)  # no CacheBusy
    assert [m.model for m in after.models] == [SYNC_MODEL]
