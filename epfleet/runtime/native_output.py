"""What a worker process's native code prints: vendor banners filtered out, everything else
kept. QNN's HTP libraries print `` # LIBNATIVE: No alternate configuration present ...``
to stdout or stderr in every process that loads them, on every compile; there is no
switch to turn that off (LIBNATIVE_CONFIG only swaps it for other ``# LIBNATIVE:``
lines). A worker therefore sends its fds 1 and 2 through a small filter process that
drops those lines and passes every other byte on to its stderr. The filter is a process,
not a thread of the worker, so that a worker that dies in native code loses nothing it
wrote: the filter reads to the end of the pipe, then exits."""

from __future__ import annotations

import os
import subprocess
import sys

BANNERS = (b" # LIBNATIVE:", b"Starting stage: ", b"Completed stage: ")
"""Line prefixes a worker's output loses (the bytes of the line as the library writes
it): QNN's banner, and the progress of each graph preparation stage that onnxruntime-qnn
2.5.0's HTP libraries print on every compile."""

_FILTER = f"""
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
banners = {BANNERS!r}
out = sys.stderr.buffer
for line in iter(sys.stdin.buffer.readline, b""):
    if not line.startswith(banners):
        out.write(line)
        out.flush()
"""


def filter_native_banners() -> None:
    """In a worker: route fds 1 and 2 (native code's and Python's own writes alike)
    through the filter, whose output is the worker's stderr as it was."""
    stderr = os.dup(2)
    filtered = subprocess.Popen(
        [sys.executable, "-S", "-c", _FILTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        close_fds=True,
    )
    os.close(stderr)
    assert filtered.stdin is not None
    writer = filtered.stdin.fileno()
    os.dup2(writer, 1)
    os.dup2(writer, 2)
    filtered.stdin.close()  # fds 1 and 2 hold the pipe now; the filter ends when they close
