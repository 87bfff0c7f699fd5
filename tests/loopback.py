"""Servers on this host's loopback for one test (the `--allow-net` tests' upstreams), and the
test host names the test tooling writes in the hosts file (scripts/ensure-test-hosts.sh)."""

import http.server
import socket
import socketserver
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.missing import cannot_run

FILES_HOST = "files.sandcell.test"  # 127.0.0.1: reached through the internal: form only
OTHER_HOST = "other.sandcell.test"  # 127.0.0.1 too, never on an allowlist
PRIVATE_HOST = "private.sandcell.test"  # 10.255.255.1: a private address nobody serves
CSV = b"region,amount\nnorth,10\nsouth,32\n"
# a cell that fetches http://{host}:{port}/x.csv: "fetched", or the error it met, in one line
FETCH = """import urllib.request
try:
    urllib.request.urlopen('http://{host}:{port}/x.csv', timeout=30).read()
    print('fetched')
except Exception as error:
    print(error)"""


class Files(http.server.BaseHTTPRequestHandler):
    """GET: CSV for a path ending .csv, else 3 MiB (over a small --net-mb)."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        body = CSV if self.path.endswith(".csv") else b"x" * (3 << 20)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def need_test_hosts() -> None:
    """Skip (fail, with CI=true) where the hosts file lacks the test names."""
    wanted = {FILES_HOST: "127.0.0.1", OTHER_HOST: "127.0.0.1", PRIVATE_HOST: "10.255.255.1"}
    for name, address in wanted.items():
        try:
            found = socket.gethostbyname(name)
        except OSError:
            found = None
        if found != address:
            cannot_run(
                f"{name} is not {address} in the hosts file (run scripts/ensure-test-hosts.sh as "
                "root; `make test` does)",
                "test host name",
            )


@contextmanager
def file_servers(*names: str) -> Iterator[tuple[dict[str, int], str]]:
    """`Files` over HTTP and over HTTPS (a certificate for `names`, FILES_HOST and OTHER_HOST
    without any, from a test CA the cells are given): ({"plain": port, "tls": port}, the CA's
    PEM)."""
    import trustme

    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*(names or (FILES_HOST, OTHER_HOST))).configure_cert(tls)
    with tcp_server(Files) as plain, tcp_server(Files, tls) as secure:
        yield {"plain": plain, "tls": secure}, ca.cert_pem.bytes().decode()


@contextmanager
def tcp_server(
    handler: type[socketserver.BaseRequestHandler], tls: ssl.SSLContext | None = None
) -> Iterator[int]:
    """`handler` served on 127.0.0.1, a thread per connection (over TLS with `tls`, each
    handshake in its connection's thread); yields the port."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
