"""`--allow-net` in real containers (issue 51), under each runtime (runc, gVisor's runsc) and
each transport (ipc; stream, over TCP as a remote engine; Podman's API): a cell reaches an
allowed HTTP and HTTPS server on this host through the proxy (the container still has no
interface but loopback) with urllib, requests and pandas, several at once, is refused any other
host in one line, cannot open a raw socket or look a name up itself, and is cut at its byte
cap; the host keeps a record of each connection. Servers listen on loopback only, named in the
hosts file by the test tooling (scripts/ensure-test-hosts.sh), reached through internal:."""

import socketserver
import threading
from dataclasses import asdict

import pytest

from sandcell.sandbox import DockerSandbox, Limits
from sandcell.sandbox.checkpoint import PauseError
from tests.loopback import (
    CSV,
    FILES_HOST,
    OTHER_HOST,
    PRIVATE_HOST,
    file_servers,
    need_test_hosts,
    tcp_server,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def runtime(runtime, transport):
    """Each runtime over each transport; Podman's API takes no runtime."""
    if transport == "podman" and runtime == "runsc":
        pytest.skip("Podman's Docker API takes no runtime: gVisor is not reachable through it")
    return runtime


@pytest.fixture(scope="module")
def servers():
    need_test_hosts()
    with file_servers() as served:
        yield served


CELL = """
import os, socket, urllib.error, urllib.request, requests, pandas as pd
open('/tmp/ca.pem', 'w').write({ca!r})
os.environ['SSL_CERT_FILE'] = os.environ['REQUESTS_CA_BUNDLE'] = '/tmp/ca.pem'
tls, plain = 'https://{files}:{tls}', 'http://{files}:{plain}'
print(urllib.request.urlopen(tls + '/a.csv', timeout=20).read().count(b'\\n'))
print(requests.get(tls + '/b.csv', timeout=20).text.count('\\n'))
print(pd.read_csv(tls + '/c.csv').amount.sum(), pd.read_csv(plain + '/d.csv').amount.sum())
def said(fetch):
    try:
        fetch()
        return 'fetched'
    except urllib.error.HTTPError as error:
        return f'{{error.code}} {{error.reason}}'
    except Exception as error:
        return f'{{type(error).__name__}}: {{error}}'
print(said(lambda: requests.get('https://{other}:{tls}/e.csv', timeout=20)))
print(said(lambda: urllib.request.urlopen('http://{other}:{plain}/f.csv', timeout=20)))
print(said(lambda: urllib.request.urlopen('http://{private}:{plain}/g.csv', timeout=20)))
print(said(lambda: socket.create_connection(('127.0.0.1', {plain}), timeout=5)))
print(said(lambda: print(sorted({{a[4][0] for a in socket.getaddrinfo('{files}', {plain})}}), end=' ')))
from concurrent.futures import ThreadPoolExecutor
at_once = ThreadPoolExecutor(4).map(lambda i: len(requests.get(plain + f'/{{i}}.csv').content), range(4))
print(*at_once)
print(said(lambda: urllib.request.urlopen(plain + '/big', timeout=30).read()))
"""


def test_a_cell_reaches_the_allowed_hosts_only_through_the_proxy_and_is_cut_at_its_cap(
    runtime, transport, servers
):
    ports, ca = servers
    allow = (
        f"internal:{FILES_HOST}:{ports['tls']}",
        f"internal:{FILES_HOST}:{ports['plain']}",
        f"{OTHER_HOST}:{ports['plain']}",  # a plain name: loopback is refused
        f"{PRIVATE_HOST}:{ports['plain']}",  # and so is a private address
    )
    cell = CELL.format(ca=ca, files=FILES_HOST, other=OTHER_HOST, private=PRIVATE_HOST, **ports)
    with DockerSandbox(limits=Limits(allow_net=allow, net_mb=1, runtime=runtime)) as sb:
        ex = sb.run(cell, timeout=90)
        assert ex.ok, ex
        assert sb.streamed == (transport != "ipc")
        with pytest.raises(PauseError, match="not paused yet" if transport == "ipc" else "ipc"):
            sb.pause(sb.conn_dir + "-paused")  # says why, and runs on
        assert sb.run("1 + 1").text == "2"
        records = list(sb.net_connections)
    may = f"this sandbox may reach: {', '.join(allow)}"
    lines = ex.stdout.splitlines()
    assert lines[:3] == ["3", "3", "42 42"], ex.stdout
    assert lines[3].startswith("ProxyError: ") and lines[3].endswith(
        f"Tunnel connection failed: 403 not allowed: {OTHER_HOST}:{ports['tls']}; {may}')))"
    ), lines[3]
    assert lines[4:] == [
        f"403 not allowed: {OTHER_HOST} resolves to 127.0.0.1 is a loopback address; name it as "
        f"internal:{OTHER_HOST}:{ports['plain']} to reach it",
        f"403 not allowed: {PRIVATE_HOST} resolves to 10.255.255.1 is a private address; name it "
        f"as internal:{PRIVATE_HOST}:{ports['plain']} to reach it",
        "ConnectionRefusedError: [Errno 111] Connection refused",
        # Podman copies the host's hosts file in: the name is there, and means this loopback
        "['127.0.0.1'] fetched"
        if transport == "podman"
        else "gaierror: [Errno -3] Temporary failure in name resolution",
        " ".join([str(len(CSV))] * 4),
        "IncompleteRead: " + lines[-1].removeprefix("IncompleteRead: "),
    ], ex.stdout
    assert [(c["host"], c["port"], c["allowed"]) for c in ex.net] == [
        (FILES_HOST, ports["tls"], True),
        (FILES_HOST, ports["tls"], True),
        (FILES_HOST, ports["tls"], True),
        (FILES_HOST, ports["plain"], True),
        (OTHER_HOST, ports["tls"], False),
        (OTHER_HOST, ports["plain"], False),
        (PRIVATE_HOST, ports["plain"], False),
        *[(FILES_HOST, ports["plain"], True)] * 5,  # four at once, then the download cut
    ]
    assert [asdict(r) for r in records] == ex.net
    cut = records[-1]
    assert (cut.address, cut.reason) == ("127.0.0.1", "cut at this sandbox's 1 MB of network")
    assert sum(r.sent + r.received for r in records) <= 1 << 20
    assert all(r.received > len(CSV) for r in records[:4])  # the TLS ones: their handshakes too


class Held(socketserver.BaseRequestHandler):
    """Holds each connection until its client's side ends, then says so."""

    ended = threading.Event()

    def handle(self):
        while self.request.recv(1024):
            pass
        Held.ended.set()


HOLD = """
import socket
held = socket.create_connection(('127.0.0.1', 3128))
held.sendall(b'CONNECT {host}:{port} HTTP/1.1\\r\\nHost: {host}:{port}\\r\\n\\r\\n')
print(held.recv(100).split(b'\\r\\n')[0].decode())
"""


def test_a_renewed_sandbox_keeps_no_connection_and_reaches_out_again(transport, servers):
    """A tunnel the last job left open ends with the renewal (the upstream sees it end), the
    records go, and the next job's connections work (over stream: new pipes at the dock)."""
    if transport == "podman":
        pytest.skip("the stream transport's pipes: tested over TCP to Docker's API")
    ports, _ = servers
    with tcp_server(Held) as held:
        allow = (f"internal:{FILES_HOST}:{held}", f"internal:{FILES_HOST}:{ports['plain']}")
        with DockerSandbox(limits=Limits(allow_net=allow), staging=True) as sb:
            opened = sb.run(HOLD.format(host=FILES_HOST, port=held), timeout=30)
            assert opened.stdout == "HTTP/1.1 200 Connection established\n", opened
            sb.renew()
            assert Held.ended.wait(10), "the tunnel outlived the renewal"
            assert not sb.net_connections
            fetch = f"import pandas as pd\nprint(len(pd.read_csv('http://{FILES_HOST}:{ports['plain']}/x.csv')))"
            again = sb.run(fetch, timeout=60)
    assert again.stdout == "2\n", again
    assert [(c["host"], c["allowed"]) for c in again.net] == [(FILES_HOST, True)]
