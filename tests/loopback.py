"""A TCP server on this host's loopback for one test (the `--allow-net` tests' upstreams)."""

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def tcp_server(handler: type[socketserver.BaseRequestHandler]) -> Iterator[int]:
    """`handler` served on 127.0.0.1, a thread per connection; yields the port."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
