"""``epfleet.stores.s3.wire`` against a server on loopback that keeps no connection alive
while saying nothing of it (as a server closing an idle keep-alive connection does): a
connection it closed is replaced, whether the pool finds it closed before sending or only
when its request gets no answer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from epfleet.stores.s3 import wire

pytestmark = pytest.mark.fast

ANSWER = b'HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: "e"\r\n\r\nhello'


@pytest.fixture
def one_answer_server() -> Iterator[tuple[int, list[int]]]:
    """A server answering one request a connection, then closing it; yields its port and
    the number of connections it accepted (a list of one)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted = [0]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted[0] += 1
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                conn.sendall(ANSWER)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()


def test_a_connection_the_server_closed_is_replaced(
    one_answer_server: tuple[int, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, accepted = one_answer_server
    pool = wire.Pool("127.0.0.1", port, 5.0, None)
    request = b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(2):  # found closed when taken from the pool
        answer = pool.get(request, 5.0)
        assert (answer.status, answer.read(100, 5.0)) == (200, b"hello")
        time.sleep(0.2)  # the server's close has arrived
    monkeypatch.setattr(wire.Connection, "fresh", lambda self: True)
    answer = pool.get(request, 5.0)  # sent on the closed one: no answer, sent again
    assert answer.read(100, 5.0) == b"hello" and answer.headers["etag"] == '"e"'
    assert accepted[0] == 3  # each answer on a connection of its own, none failed
