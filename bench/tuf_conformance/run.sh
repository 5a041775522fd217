#!/usr/bin/env bash
# Run tuf-conformance (theupdateframework/tuf-conformance, not vendored: give a checkout)
# against the device's trust client (bench/tuf_conformance/epfleet_client.py).
#
#   bench/tuf_conformance/run.sh /path/to/tuf-conformance [pytest args...]
#
# It needs: a checkout of tuf-conformance with its venv (python3 -m venv .venv &&
# .venv/bin/pip install -e .), the `faketime` binary (Debian: apt-get install faketime),
# and epfleet installed in the Python that runs this script (or EPFLEET_PYTHON).
set -euo pipefail
suite="$(cd "$1" && pwd)"; shift
here="$(cd "$(dirname "$0")" && pwd)"
python="${EPFLEET_PYTHON:-$(command -v python3)}"
client="$(mktemp -d)/epfleet-client"
printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$python" "$here/epfleet_client.py" > "$client"
chmod +x "$client"
cp "$here/epfleet_client.xfails" "$client.xfails" 2>/dev/null || true
cd "$suite"
exec .venv/bin/pytest tuf_conformance --entrypoint "$client" "$@"
