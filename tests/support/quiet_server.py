"""A threading HTTP server for the tests' own servers (the mirror, the S3 proxy) that keeps
quiet when a client hangs up mid-answer: the device under test does that on purpose (a
deadline, a guard aborting a slow body), and ``socketserver`` would print each such
``ConnectionResetError`` traceback among the test run's dots. Any other error in a
handler is still printed."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        super().handle_error(request, client_address)
