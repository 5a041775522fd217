"""Benchmark: what a device installs, and what `epfleet sync` loads, per install.

    python bench/device_install.py [--before REF] [--repeat N]

Each install goes into a fresh venv (pip's defaults: byte-compiled, from the configured
package indexes) from this checkout, or from git revision REF's tree with `--before`:

    device        pip install .                   epfleet sync, local and https:// stores
    device+qnn    pip install ".[qnn]"            the same with the QNN plugin
    host          pip install ".[host,s3,qnn]"    the compile host: what every install
                                                  was before the device install
    before        REF's pip install ".[qnn]"      (with --before)

For each: the size of the venv's site-packages (du; pip and setuptools, which every venv
has, counted apart), the number of distributions, then, median of `--repeat` runs (5):
the wall seconds of `epfleet sync --help`, and of a no-op sync (the model kept) of a
signed local store (one small CPU model, tests/support/hand_made_fleet.py) with its
import time (`python -X importtime`: the seconds spent importing and the modules
imported). Ratios are to `before` when given, else to `host`. Timings on a shared
machine are noisy (the load average is printed before and after); the sizes are not.
No target is asserted.

Measured here (`--before 3c7fe3e`, the last commit with Prefect and boto3 in every
install; `--repeat 3`; load 29.6 then 26.9 on 2 cores):

    install      site MB  dists  sync --help  no-op sync  imports  modules
    device           270     30       3.20 s      2.70 s   2.01 s      614
                   0.34x               0.45x       0.43x    0.39x
    device+qnn       600     35       1.52 s      1.82 s   1.47 s      616
                   0.75x               0.21x       0.29x    0.28x
    host             819    126       3.68 s      5.17 s   4.10 s      616
                   1.03x               0.52x       0.82x    0.79x
    before           796    125       7.06 s      6.28 s   5.19 s      615

The sizes are the result; the times are the load's (each sync imports the same 614-616
modules, without Prefect or boto3 before as now), to be measured again on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETUP_PACKAGES = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth")


@dataclass
class Install:
    name: str
    source: Path
    extras: str

    def requirement(self) -> str:
        return f"{self.source}[{self.extras}]" if self.extras else str(self.source)


@dataclass
class Figures:
    site_mb: float
    setup_mb: float
    distributions: int
    help_s: float
    sync_s: float
    import_s: float
    modules: int


def du_mb(*paths: Path) -> float:
    existing = [str(p) for p in paths if p.exists()]
    if not existing:
        return 0.0
    out = subprocess.run(["du", "-sk", "-c", *existing], capture_output=True, text=True).stdout
    return int(out.splitlines()[-1].split()[0]) / 1024


def make_venv(install: Install, where: Path) -> Path:
    venv = where / install.name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", install.requirement()],
        check=True,
    )  # fmt: skip
    return venv


def site_packages(venv: Path) -> Path:
    (found,) = (venv / "lib").glob("python3*/site-packages")
    return found


def device_env() -> dict[str, str]:
    dropped = ("PYTHONPATH", "VIRTUAL_ENV")
    return {
        k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("EPFLEET_")
    }


def timed(argv: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=device_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return wall, done.stderr


def import_seconds(importtime: str) -> tuple[float, int]:
    """The seconds ``-X importtime`` counts (the sum of its self column) and the modules."""
    total, modules = 0, 0
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            total += int(line.split(":", 1)[1].split("|")[0])
            modules += 1
    return total / 1e6, modules


def measure(venv: Path, store: str, root: Path, work: Path, repeat: int) -> Figures:
    site = site_packages(venv)
    setup = [site / name for name in SETUP_PACKAGES] + list(site.glob("pip-*.dist-info"))
    setup += list(site.glob("setuptools-*.dist-info"))
    bin_dir = venv / "bin"
    cache = work / f"cache-{venv.name}"
    sync = [str(bin_dir / "epfleet"), "sync", "--store", store, "--cache", str(cache)]
    timed([*sync, "--device-id", "bench", "--trust-root", str(root)], work)  # downloads
    helps, syncs, imports, modules = [], [], [], 0
    for _ in range(repeat):
        helps.append(timed([str(bin_dir / "epfleet"), "sync", "--help"], work)[0])
        python = [str(bin_dir / "python"), "-X", "importtime", "-m", "epfleet"]
        wall, stderr = timed([*python, *sync[1:], "--device-id", "bench"], work)
        syncs.append(wall)
        seconds, modules = import_seconds(stderr)
        imports.append(seconds)
    return Figures(
        site_mb=du_mb(site) - du_mb(*setup),
        setup_mb=du_mb(*setup),
        distributions=len(list(site.glob("*.dist-info"))),
        help_s=statistics.median(helps),
        sync_s=statistics.median(syncs),
        import_s=statistics.median(imports),
        modules=modules,
    )


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git revision whose .[qnn] install to compare")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from tests.support.hand_made_fleet import make_fleet

    with tempfile.TemporaryDirectory(prefix="device-install-") as tmp:
        work = Path(tmp)
        installs = [
            Install("device", ROOT, ""),
            Install("device+qnn", ROOT, "qnn"),
            Install("host", ROOT, "host,s3,qnn"),
        ]
        if args.before:
            tree = work / "before-tree"
            tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.before], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            installs.append(Install("before", tree, "qnn"))
        fleet_dir = work / "fleet"
        fleet_dir.mkdir()
        fleet = make_fleet(str(fleet_dir / "store"), fleet_dir)
        print(f"load before: {load()}")
        figures: dict[str, Figures] = {}
        for install in installs:
            started = time.perf_counter()
            venv = make_venv(install, work / "venvs")
            took = time.perf_counter() - started
            figures[install.name] = measure(venv, fleet.uri, fleet.root, work, args.repeat)
            print(f"  {install.name}: installed in {took:.0f} s")
            shutil.rmtree(venv)
        print(f"load after: {load()}")
    base = figures["before" if "before" in figures else "host"]
    print()
    header = f"{'install':<11} {'site MB':>8} {'dists':>6} {'sync --help':>12} {'no-op sync':>11}"
    print(f"{header} {'imports':>8} {'modules':>8}")
    for name, f in figures.items():
        print(
            f"{name:<11} {f.site_mb:>8.0f} {f.distributions:>6} {f.help_s:>10.2f} s"
            f" {f.sync_s:>9.2f} s {f.import_s:>6.2f} s {f.modules:>8}"
        )
        print(
            f"{'':<11} {f.site_mb / base.site_mb:>7.2f}x {'':>6} {f.help_s / base.help_s:>11.2f}x"
            f" {f.sync_s / base.sync_s:>10.2f}x {f.import_s / base.import_s:>7.2f}x"
        )
    print(f"\n(pip and setuptools, in every venv and left out above: {base.setup_mb:.0f} MB)")


if __name__ == "__main__":
    main()
