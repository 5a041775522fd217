"""The get-started pages run as written: every ``sh`` block of
docs/get-started/index.md, s3.md and prefect-server.md, in that order, as a newcomer runs
them, in one shell, in a fresh copy of this clone (a git work tree of its own) with a new
home directory and none of the tests' ``EPFLEET_*``, ``AWS_*`` or ``PREFECT_*`` settings.

What is not run as written, and why:
- the virtual environment's set-up (``python3 -m venv``, its activation and the
  ``pip install -e`` of the clone, with any extras) and the fast tier's pytest command: CI made this very
  environment that way from this clone, and is running the tests; the venv's ``bin`` is
  first on ``PATH``, as activation puts it;
- the ports 5055 (moto) and 4200 (Prefect) are replaced with free ones, so that other
  tests' servers on this machine cannot collide with the page's.
A command that fails is recorded by an ERR trap (the shell goes on, as a terminal would)
and fails the test, except the Stop lines' ``kill``/``wait``, whose status is the stopped
process's own. The outcomes each page promises are checked on its output.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow

PAGES = ["index.md", "s3.md", "prefect-server.md"]
DONE_BY_CI = (
    "python3 -m venv .venv",
    ". .venv/bin/activate",
    'python -m pip install -e ".[host,qnn]"',
    'python -m pip install -e ".[qnn,test]"',
    'python -m pip install -e ".[s3]"',
    "python -m pytest -q -n auto -m fast",
)
FAILED = "GET-STARTED-FAILED"


def shell_blocks(page: Path) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def as_run_here(block: str, ports: dict[str, str]) -> str:
    lines = []
    for line in block.splitlines():
        kept = [part for part in line.split(" && ") if part.strip() not in DONE_BY_CI]
        if kept:
            lines.append(" && ".join(kept))
    text = "\n".join(lines)
    for written, free in ports.items():
        text = text.replace(written, free)
    return text


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def fresh_clone(tmp_path: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    clone = tmp_path / "clone"
    for name in filter(None, listed):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            (clone / source.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / source.relative_to(REPO))
    subprocess.run(["git", "init", "-q"], cwd=clone, check=True)
    return clone


def newcomer_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("EPFLEET_", "AWS_", "PREFECT_", "PYTEST_", "PYTHONPATH"))
    }
    env["HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"  # no internet in CI
    return env


def test_the_get_started_pages_run_as_written(tmp_path: Path) -> None:
    clone, home = fresh_clone(tmp_path), tmp_path / "home"
    home.mkdir()
    ports = {"5055": free_port(), "4200": free_port()}
    script = [
        f"trap 'echo \"{FAILED} ($?): $BASH_COMMAND\" >&2' ERR",
        "trap 'kill $(jobs -p) 2>/dev/null' EXIT",
    ]
    for page in PAGES:
        script.append(f"echo '=== {page}'")
        script += [as_run_here(b, ports) for b in shell_blocks(REPO / "docs/get-started" / page)]
    done = subprocess.Popen(
        ["bash", "-c", "\n".join(script)],
        cwd=clone,
        env=newcomer_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = done.communicate(timeout=1500)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(done.pid, signal.SIGKILL)  # anything a page left running
    pages = dict(re.findall(r"^=== (\S+)\n(.*?)(?=^=== |\Z)", out, flags=re.S | re.M))
    assert list(pages) == PAGES, out[-4000:]
    failed = [
        line
        for line in out.splitlines()
        if line.startswith(FAILED) and not re.search(r": (kill|wait) \$(worker|server|moto)", line)
    ]
    assert failed == [], out[-6000:]
    assert "Traceback" not in out, out[-6000:]

    started = pages["index.md"]
    assert "6 compiled, 0 up to date, 0 failed" in started, started[-3000:]
    assert "2 of 2 models served" in started
    assert (clone / "epfleet-device" / "manifest.json").is_file()  # an ORT model package

    s3 = pages["s3.md"]
    assert "created the signed metadata of s3://fleet/prod" in s3, s3[-3000:]
    assert "2 of 2 models served" in s3 and "signed, timestamp v" in s3
    assert (home / "fleet-keys" / "root.json").is_file()
    assert not (clone / "fleet-keys").exists()

    server = pages["prefect-server.md"]
    assert "Flow run finished successfully in 'Completed'" in server, server[-3000:]
    assert (clone / ".prefect-server").is_dir()  # its own PREFECT_HOME
    assert done.returncode is not None
