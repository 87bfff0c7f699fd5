"""The host's proxy of `--allow-net` (issue 51, first step), without a container: the
allowlist's entries, the addresses a sandbox may never reach by a plain name, and the proxy on
a Unix socket in front of real servers on loopback, with its resolver replaced in-process."""

import ipaddress
import socket
import socketserver
import threading
from contextlib import contextmanager

import pytest

from sandcell.sandbox.allowlist import Allowlist, refused_address
from sandcell.sandbox.net_proxy import NetLimits, NetProxy
from tests.loopback import CSV as BODY
from tests.loopback import Files, tcp_server

pytestmark = pytest.mark.timeout(60)


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(4096):
            self.request.sendall(data)


@contextmanager
def proxy(tmp_path, allow: str, names=None, **limits):
    """A proxy for `allow`, whose resolver knows `names` ({name: [address, ...]}); yields
    (proxy, the records of its connections, the names it looked up)."""
    records, asked = [], []

    async def resolver(host, port):
        asked.append(host)
        answers = (names or {}).get(host)
        if answers is None:
            raise OSError(f"no such name: {host}")
        return answers(len(asked)) if callable(answers) else answers

    made = NetProxy(Allowlist.parse([allow]), tmp_path / "net.sock", NetLimits(**limits),
                    records.append, resolver).start()  # fmt: skip
    try:
        yield made, records, asked
    finally:
        made.close()


def through(made, request: bytes, more: bytes = b"") -> bytes:
    """Send a request through the proxy's socket, as the sandbox's forwarder does; all of the
    answer."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(made.path))
        s.sendall(request + more)
        s.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: s.recv(65536), b""))


def get(port: int, name: str = "files.test", path: str = "/data.csv") -> bytes:
    return f"GET http://{name}:{port}{path} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode()


def test_entries_parse_match_narrow_and_say_what_is_wrong():
    allow = Allowlist.parse(["data.example.org, *.example.com:8443", "internal:Intra.Local:8080"])
    assert str(allow) == "data.example.org, *.example.com:8443, internal:intra.local:8080"
    assert allow.entry_for("DATA.example.org.", 443) and allow.entry_for("data.example.org", 80)
    assert not allow.entry_for("data.example.org", 8443)
    assert allow.entry_for("a.b.example.com", 8443) and not allow.entry_for("example.com", 8443)
    assert allow.entry_for("intra.local", 8080).internal
    narrowed = allow.narrowed(Allowlist.parse(["data.example.org:443", "x.example.com:8443",
                                               "other.org", "internal:data.example.org"]))  # fmt: skip
    assert str(narrowed) == "data.example.org:443, x.example.com:8443"
    assert not Allowlist.parse([]) and str(Allowlist.parse([])) == "nothing"
    for bad, said in [("a.com:0", "port"), ("a.com:x", "port"), ("*", "not a host"),
                      ("*.com", "two labels"), ("a_b.com", "not a host"), ("-a.com", "not a host")]:  # fmt: skip
        with pytest.raises(ValueError, match=said):
            Allowlist.parse([bad])


@pytest.mark.parametrize(
    ("address", "why"),
    [("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.9", "private"),
     ("169.254.169.254", "link-local"), ("100.64.1.1", "carrier-grade NAT"),
     ("224.0.0.251", "multicast"), ("0.0.0.0", "unspecified"), ("::1", "loopback"),
     ("::ffff:127.0.0.1", "loopback"), ("fe80::1", "link-local"), ("fd00::1", "private"),
     ("240.0.0.1", "reserved"), ("93.184.216.34", None), ("2606:4700::1111", None)],
)  # fmt: skip
def test_addresses_a_plain_name_may_not_lead_to(address, why):
    said = refused_address(ipaddress.ip_address(address))
    assert (said is None) if why is None else (why in said), said


def test_an_allowed_host_is_fetched_and_each_connection_is_recorded(tmp_path):
    with tcp_server(Files) as port, proxy(tmp_path, f"internal:files.test:{port}",
                                       {"files.test": ["127.0.0.1"]}) as (made, records, _):  # fmt: skip
        answer = through(made, get(port))
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(BODY)
    (record,) = records
    assert (record.host, record.port, record.address, record.allowed) == (
        "files.test",
        port,
        "127.0.0.1",
        True,
    )
    assert record.sent > 0 and record.received == len(answer) and record.reason == ""


def test_a_host_not_on_the_list_is_refused_in_one_line_that_says_what_may_be_reached(tmp_path):
    with proxy(tmp_path, "data.example.org", {"other.test": ["93.184.216.34"]}) as (
        made,
        records,
        asked,
    ):
        answer = through(made, b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")
    status = answer.split(b"\r\n")[0].decode()
    assert status == (
        "HTTP/1.1 403 not allowed: other.test:443; this sandbox may reach: data.example.org"
    )
    assert asked == [] and records[0].allowed is False  # refused before any lookup


def test_a_plain_name_that_resolves_to_loopback_is_refused_and_reached_only_as_internal(tmp_path):
    names = {"files.test": ["127.0.0.1"]}
    with tcp_server(Files) as port:
        with proxy(tmp_path, f"files.test:{port}", names) as (made, records, _):
            refused = through(made, get(port))
        assert refused.startswith(
            f"HTTP/1.1 403 not allowed: files.test resolves to 127.0.0.1 is a loopback address; "
            f"name it as internal:files.test:{port}".encode()
        ), refused
        with proxy(tmp_path, f"internal:files.test:{port}", names) as (made, records, _):
            assert through(made, get(port)).endswith(BODY)


def test_one_lookup_per_connection_and_it_goes_to_the_address_that_was_checked(tmp_path):
    # a resolver that answers loopback first, then a private address no server is on
    answers = lambda n: ["127.0.0.1"] if n % 2 else ["10.255.255.1"]  # noqa: E731
    with tcp_server(Files) as port, proxy(tmp_path, f"internal:files.test:{port}",
                                       {"files.test": answers}) as (made, records, asked):  # fmt: skip
        assert through(made, get(port)).endswith(BODY)
        assert asked == ["files.test"] and records[0].address == "127.0.0.1"


def test_connect_tunnels_bytes_both_ways_and_the_byte_cap_cuts_a_download(tmp_path):
    with tcp_server(Echo) as port, proxy(tmp_path, f"internal:echo.test:{port}",
                                      {"echo.test": ["127.0.0.1"]}) as (made, records, _):  # fmt: skip
        answer = through(made, f"CONNECT echo.test:{port} HTTP/1.1\r\n\r\n".encode(), b"ping")
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\nping"
    assert (records[0].sent, records[0].received) == (4, 4)
    with tcp_server(Files) as port, proxy(tmp_path, f"internal:files.test:{port}",
                                       {"files.test": ["127.0.0.1"]}, total_bytes=100_000) as (made, records, _):  # fmt: skip
        answer = through(made, get(port, path="/big"))
    assert len(answer) < 100_000 and records[0].received < 100_000
    assert records[0].reason == "cut at this sandbox's 0.0953674 MB of network"


def test_connections_at_once_are_capped_and_close_ends_the_open_ones(tmp_path):
    with tcp_server(Echo) as port, proxy(tmp_path, f"internal:echo.test:{port}",
                                      {"echo.test": ["127.0.0.1"]}, connections=1) as (made, records, _):  # fmt: skip
        held = socket.socket(socket.AF_UNIX)
        held.settimeout(30)
        held.connect(str(made.path))
        held.sendall(f"CONNECT echo.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert held.recv(100).startswith(b"HTTP/1.1 200")
        second = through(made, f"CONNECT echo.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert second.startswith(b"HTTP/1.1 503 too many connections at once (1)")
        made.close()
        assert held.recv(100) == b"" and not made.path.exists()
        held.close()
    assert [r.reason for r in records] == ["the sandbox was closed"]  # the refused one: unread


def test_the_container_s_forwarder_carries_urllib_and_pandas_through_the_proxy(tmp_path):
    """What a cell does (HTTP_PROXY set, a plain urllib or pandas call), with the forwarder
    the container runs on its loopback in front of the host's proxy; here both on this host."""
    import subprocess
    import sys

    from sandcell.images import net_forwarder

    cell = (
        "import urllib.request, urllib.error, pandas as pd\n"
        "print(pd.read_csv('http://files.test:{port}/data.csv').amount.sum())\n"
        "try:\n"
        "    urllib.request.urlopen('http://other.test:{port}/data.csv')\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code, e.reason)\n"
    )
    with tcp_server(Files) as port, proxy(tmp_path, f"internal:files.test:{port}",
                                       {"files.test": ["127.0.0.1"]}) as (made, records, _):  # fmt: skip
        listener = net_forwarder.listening(0)
        threading.Thread(
            target=net_forwarder.serve,
            args=(listener, net_forwarder.connector(str(made.path))),
            daemon=True,
        ).start()
        proxy_url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        env = {"HTTP_PROXY": proxy_url, "http_proxy": proxy_url, "NO_PROXY": "", "PATH": "/usr/bin"}
        run = subprocess.run([sys.executable, "-c", cell.format(port=port)], env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        listener.close()
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "42",
        f"403 not allowed: other.test:{port}; this sandbox may reach: internal:files.test:{port}",
    ]
    assert [(r.host, r.allowed) for r in records] == [("files.test", True), ("other.test", False)]


@pytest.mark.parametrize(
    "target",
    ["evil.com\x00.example.org:443", "evil.com%eth0.example.org:443", "a b.example.org:443",
     "x.example.org\t:443", "é.example.org:443", "x.example.org:0", "x.example.org:70000"],
)  # fmt: skip
def test_a_name_no_resolver_would_read_as_written_is_refused_before_any_lookup(tmp_path, target):
    with proxy(tmp_path, "internal:*.example.org", {}) as (made, records, asked):
        answer = through(
            made, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode("utf-8", "surrogateescape")
        )
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert asked == []


def test_connections_that_send_nothing_hold_no_slot_past_the_cap(tmp_path):
    with proxy(tmp_path, "data.example.org", {}, connections=2) as (made, records, _):
        idle = []
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(made.path))
            idle.append(s)
        import time

        time.sleep(0.3)  # both accepted and waiting for their heads
        third = through(made, b"CONNECT data.example.org:443 HTTP/1.1\r\n\r\n")
        assert third.startswith(b"HTTP/1.1 503 too many connections at once (2)"), third
        for s in idle:
            s.close()


def test_a_long_download_is_not_idle_and_a_silent_one_is(tmp_path):
    import time

    class Slow(socketserver.BaseRequestHandler):
        def handle(self):
            for _ in range(10):  # a byte every 0.2 s: 2 s in all, never 1 s idle
                self.request.sendall(b"x")
                time.sleep(0.2)

    with (
        tcp_server(Slow) as port,
        proxy(tmp_path, f"internal:slow.test:{port}", {"slow.test": ["127.0.0.1"]},
              idle_s=1) as (made, records, _),
        socket.socket(socket.AF_UNIX) as s,
    ):  # fmt: skip
        s.settimeout(30)  # the sandbox sends nothing after its request
        s.connect(str(made.path))
        s.sendall(f"CONNECT slow.test:{port} HTTP/1.1\r\n\r\n".encode())
        answer = b"".join(iter(lambda: s.recv(65536), b""))
    assert answer.endswith(b"x" * 10) and records[0].reason == "", records

    class Flood(socketserver.BaseRequestHandler):
        def handle(self):
            try:
                while True:
                    self.request.sendall(b"z" * 65536)
            except OSError:
                pass

    with (
        tcp_server(Flood) as port,
        proxy(tmp_path, f"internal:flood.test:{port}", {"flood.test": ["127.0.0.1"]},
              idle_s=0.5) as (made, records, _),
        socket.socket(socket.AF_UNIX) as s,
    ):  # fmt: skip
        s.connect(str(made.path))  # half-closed, and never read: its writes block, then end
        s.sendall(f"CONNECT flood.test:{port} HTTP/1.1\r\n\r\n".encode())
        s.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 10
        while not records and time.monotonic() < deadline:
            time.sleep(0.1)
    assert records and records[0].reason == "idle for 0.5 s", records


def test_every_allowed_address_of_the_one_lookup_is_tried_in_turn(tmp_path):
    with tcp_server(Files) as port, proxy(tmp_path, f"internal:files.test:{port}",
                                       {"files.test": ["127.0.0.9", "127.0.0.1"]}) as (made, records, asked):  # fmt: skip
        assert through(made, get(port)).endswith(BODY)
    assert asked == ["files.test"] and records[0].address == "127.0.0.1"


@pytest.mark.parametrize(
    "address", ["2002:a9fe:a9fe::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "fec0::1"]
)
def test_ipv4_inside_ipv6_is_judged_as_itself(address):
    assert refused_address(ipaddress.ip_address(address)) is not None
