"""What the benchmarks share: moto's S3 server in a process of its own (a store does not
share the client's GIL and heap), and a TCP relay on loopback that counts bytes and can
behave like a real link (paced bandwidth, a round trip per request)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

MOTO = """if True:
    import logging, sys
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    sys.stdin.read()  # until the benchmark closes it
    server.stop()
"""


@contextmanager
def moto_in_own_process() -> Iterator[int]:
    """Start moto, point this process's AWS settings at it and yield its port."""
    moto = subprocess.Popen(
        [sys.executable, "-c", MOTO], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert moto.stdout is not None and moto.stdin is not None
    try:
        port = int(moto.stdout.readline())
        os.environ |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
        os.environ |= {"AWS_DEFAULT_REGION": "us-east-1"}
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
        yield port
    finally:
        moto.stdin.close()
        moto.wait(timeout=30)


class Relay:
    """A TCP relay on loopback that counts the bytes each way (HTTP headers included). With
    ``rate`` (bytes/s) it paces the downstream of all connections like one network link;
    with ``latency`` (s) it holds each request that long before passing it on, as the
    round trip to a real endpoint would."""

    def __init__(self, upstream_port: int, rate: float | None = None, latency: float = 0.0) -> None:
        self.bytes = [0, 0]  # client to server, server to client
        self.rate, self.latency = rate, latency
        self._lock = threading.Lock()
        self._free_at = 0.0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint_url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, args=(upstream_port,), daemon=True).start()

    def _accept(self, port: int) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", port))
            for way, src, dst in ((0, client, upstream), (1, upstream, client)):
                threading.Thread(target=self._pipe, args=(way, src, dst), daemon=True).start()

    def _pace(self, size: int) -> None:
        """One link shared by every connection: each chunk waits for its slot on it."""
        assert self.rate
        with self._lock:
            now = time.perf_counter()
            self._free_at = max(self._free_at, now) + size / self.rate
            wait = self._free_at - now
        time.sleep(wait)

    def _pipe(self, way: int, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                self.bytes[way] += len(data)  # counted before the peer can see it
                if self.latency and way == 0:
                    time.sleep(self.latency)
                if self.rate and way == 1:
                    self._pace(len(data))
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
