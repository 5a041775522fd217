"""Where the device cache keeps what: the names of its paths and its size units.

DIR/manifest.json                      ORT model package: component per model
DIR/models/<model>/<variant>/model.onnx
DIR/.epfleet/state.json                epfleet's own state (written atomically)
DIR/.epfleet/fleet-manifest.json       the last valid fleet manifest (offline use)
DIR/.epfleet/partial/<sha256>.part     interrupted downloads, resumed by range
DIR/.epfleet/scratch/                  compile and assembly scratch, removed by tidy
DIR/.epfleet/last-report.json          the last sync's device report
DIR/.epfleet/report-sent.json          what the store last received of it, and when
DIR/.epfleet/lock                      one sync at a time
"""

from __future__ import annotations

import re

from epfleet.text import MB

PACKAGE_MANIFEST = "manifest.json"
PACKAGE_NAME = "epfleet-device-cache"
MODEL_FILE = "model.onnx"
STATE_DIR = ".epfleet"
STATE_FILE = "state.json"
FLEET_MANIFEST = "fleet-manifest.json"
LAST_REPORT = "last-report.json"
REPORT_SENT = "report-sent.json"
LOCK_FILE = "lock"
PARTIAL_MAX_AGE = 7 * 24 * 3600.0

DISK_MARGIN = 16 * MB
"""Free space a download leaves beyond its own bytes: the state, the manifests and the
report are written after it, and the device's other programs need room too."""
VARIANT_DIR = re.compile(r"[a-z0-9][a-z0-9._-]*-[0-9a-f]{12}")
PARTIAL_FILE = re.compile(r"[0-9a-f]{64}\.part(\.progress)?")
OWN_FILES = frozenset({PACKAGE_MANIFEST, STATE_FILE, FLEET_MANIFEST, LAST_REPORT, REPORT_SENT})


def local_target_name(ep: str) -> str:
    """The target a variant built on the device is named after (``local-<ep>``), its
    directory's prefix."""
    return "local-" + ep.lower().removesuffix("executionprovider")
