"""A test's own HTTP endpoint for CMQ's push (D7), served from threads of the test process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["EndpointServer", "serve_endpoint"]


class EndpointServer(ThreadingHTTPServer):
    # The gateway pushes on up to 100 pooled connections at once (gateway.push). socketserver's
    # listen backlog of 5 dropped the rest's SYNs; on a loaded machine their retransmits took a
    # good message's first push past the 15 s push timeout, and D6 then parked its retry behind
    # a failing message: the test saw a message "lost" that the gateway rightly still owed. A
    # real endpoint (any web server) listens with a backlog of hundreds.
    request_queue_size = 1024


@contextlib.contextmanager
def serve_endpoint(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a server running ``handler`` until the block ends."""
    server = EndpointServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
