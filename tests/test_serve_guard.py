"""`sandcell serve`'s edges before any route runs: the token before the body, the Host header
(DNS rebinding), the Origin of state-changing requests, and `/?token=` from another site's
link. A real uvicorn on loopback, real HTTP clients (httpx, and a raw socket where a client
library would send the whole body before reading the answer)."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from sandcell.agent.cli import main
from sandcell.agent.hosting.guard import Hosts
from tests.scripted_server import ScriptedServer
from tests.serve_helpers import ALICE, client, config, serving

NO_SESSION = "0123456789abcdef"


@pytest.fixture
def model():
    with ScriptedServer() as server:
        yield server


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def open_fds_under(folder: Path) -> list[str]:
    """Files this process holds open under FOLDER, unlinked ones too (a spooled upload is
    an unlinked temporary file: it never shows in a listing, only here)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


def start_upload(base: str, headers: str, sent: bytes) -> socket.socket:
    """A multipart upload declared at 50 MB, of which only SENT goes out: the rest is never
    sent, so an answer can only come from a server that did not wait for the body."""
    sock = socket.create_connection(("127.0.0.1", port_of(base)), timeout=10)
    head = (
        f"POST /api/sessions/{NO_SESSION}/files HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port_of(base)}\r\n"
        "Content-Type: multipart/form-data; boundary=b\r\n"
        f"Content-Length: {50 << 20}\r\n{headers}\r\n"
    )
    sock.sendall(head.encode() + sent)
    return sock


def answer_of(sock: socket.socket) -> bytes:
    """The response head and its JSON body (it says its length), read with the socket's
    timeout: socket.timeout means the server is still waiting for the body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )  # fmt: skip
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
@pytest.mark.parametrize("token", [None, "not-a-token-of-this-server"])
def test_an_upload_without_a_known_token_is_401_before_its_body_is_read(
    model, tmp_path, monkeypatch, token
):
    spool = tmp_path / "spool"  # where Starlette would spool the parts of a multipart body
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    data = tmp_path / "data"
    with serving(config(model, data, max_upload_mb=100)) as base:
        before = files_under(data)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.csv"\r\n\r\n'
        sock = start_upload(base, auth, part + b"x" * (3 << 20))  # over the 1 MB spool size
        try:
            answer = answer_of(sock)  # 47 MB of the body are still unsent
            status = answer.split(b"\r\n", 1)[0]
            assert status.startswith(b"HTTP/1.1 401"), answer[:300]
            assert b"www-authenticate: Bearer" in answer
            assert b'{"error": "' in answer and b"Authorization: Bearer" in answer
            if token:
                assert b"not one of this server's" in answer
            assert open_fds_under(spool) == [] and list(spool.iterdir()) == []
        finally:
            sock.close()
        assert files_under(data) == before


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
def test_a_known_token_in_header_or_cookie_passes_and_health_openapi_page_stay_open(
    model, tmp_path
):
    with serving(config(model, tmp_path / "data")) as base:
        with client(base) as api:
            assert api.get(f"/api/sessions/{NO_SESSION}").status_code == 404
        with client(base, token=None) as cookied:
            cookied.cookies.set("sandcell_token", ALICE)
            assert cookied.get("/api/sessions").json() == []
        with client(base, token=None) as anon:
            for path in ("/api/health", "/openapi.json", "/", "/static/page.js"):
                assert anon.get(path).status_code == 200, path
            r = anon.get("/api/nowhere")  # the token first: no hint of which routes exist
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
def test_host_header_loopback_names_pass_another_name_is_403_unless_allowed(model, tmp_path):
    with serving(config(model, tmp_path / "a", allowed_hosts=("sandcell.test",))) as base:
        port = port_of(base)
        with client(base) as api:
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}",
                         "localhost", f"sandcell.test:{port}", f"SANDCELL.test:{port}"):  # fmt: skip
                r = api.get("/api/sessions", headers={"Host": host})
                assert r.status_code == 200, (host, r.text)
            for host in (f"evil.example:{port}", "evil.example", f"192.168.1.7:{port}",
                         f"localhost.evil.example:{port}", "bad:port"):  # fmt: skip
                r = api.get("/api/health", headers={"Host": host})
                assert r.status_code == 403, (host, r.text)
                assert "--allowed-host" in r.json()["error"]
            r = api.get("/", headers={"Host": f"evil.example:{port}"})
            assert r.status_code == 403 and "'evil.example'" in r.json()["error"]
    with serving(config(model, tmp_path / "b")) as base, client(base) as api:
        r = api.get("/api/health", headers={"Host": f"sandcell.test:{port_of(base)}"})
        assert r.status_code == 403 and "--allowed-host sandcell.test" in r.json()["error"]


def test_hosts_beyond_loopback_the_bound_address_any_ip_on_a_wildcard_and_star():
    wildcard = Hosts("0.0.0.0")
    assert wildcard.allows("10.1.2.3") and wildcard.allows("localhost")
    assert not wildcard.allows("files.example")
    assert Hosts("::").allows("fe80::1")
    one = Hosts("192.168.1.5", ("files.example",))
    assert one.allows("192.168.1.5") and one.allows("files.example") and one.allows("::1")
    assert not one.allows("192.168.1.6") and not one.allows("evil.example")
    named = Hosts("box.lan")
    assert named.allows("box.lan") and not named.allows("10.1.2.3")
    assert Hosts("127.0.0.1", ("*",)).allows("anything.example")
    assert not Hosts("127.0.0.1").allows("10.1.2.3")
    assert Hosts("127.0.0.1", ("Files.Example:8080", "[fd00::1]")).allows("files.example")
    assert Hosts("127.0.0.1", ("[fd00::1]",)).allows("fd00::1")


def test_an_allowed_host_that_is_not_a_name_is_a_usage_error():
    runner = CliRunner()
    for value in ("http://files.example/", "*.example", "user@files.example"):
        result = runner.invoke(main, ["serve", "--allowed-host", value], prog_name="sandcell")
        assert result.exit_code == 2 and "is not a host name" in result.stderr, value


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
def test_a_state_changing_request_from_another_origin_is_403(model, tmp_path):
    with serving(config(model, tmp_path / "data")) as base, client(base) as api:
        interrupt = f"/api/sessions/{NO_SESSION}/interrupt"
        for origin in ("http://evil.example", "null", f"http://localhost:{port_of(base)}",
                       f"http://127.0.0.1:{port_of(base) + 1}"):  # fmt: skip
            r = api.post(interrupt, headers={"Origin": origin})
            assert r.status_code == 403, (origin, r.text)
            assert "another site" in r.json()["error"]
            assert (
                api.delete(f"/api/sessions/{NO_SESSION}", headers={"Origin": origin}).status_code
                == 403
            )
        # its own origin, and API clients that send no Origin, reach the route (no such session)
        assert api.post(interrupt, headers={"Origin": base}).status_code == 404
        assert api.post(interrupt).status_code == 404
        # reading is not state-changing: a foreign Origin on a GET is left to the token
        assert (
            api.get("/api/sessions", headers={"Origin": "http://evil.example"}).status_code == 200
        )


# -- signing in by link ---------------------------------------------------------------------------


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_a_token_link_from_another_site_sets_no_cookie_and_asks_for_a_click(model, tmp_path, site):
    with serving(config(model, tmp_path / "data")) as base, client(base, token=None) as browser:
        r = browser.get("/", params={"token": ALICE}, headers={"Sec-Fetch-Site": site})
        assert r.status_code == 200 and "set-cookie" not in r.headers
        assert not browser.cookies
        page = r.text
        assert '<form method="get" action="/">' in page and "<script" not in page
        assert f'name="token" value="{ALICE}"' in page and 'data-testid="sign-in"' in page
        csp = r.headers["content-security-policy"]
        assert "script-src 'none'" in csp and "form-action 'self'" in csp
        assert "frame-ancestors 'none'" in csp and r.headers["cache-control"] == "no-store"
        # a token that is not one of the server's is still 401, from anywhere
        bad = browser.get("/", params={"token": "nope"}, headers={"Sec-Fetch-Site": site})
        assert bad.status_code == 401


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
@pytest.mark.parametrize("site", ["none", "same-origin", None])
def test_a_typed_or_own_navigation_sets_the_cookie(model, tmp_path, site):
    headers = {"Sec-Fetch-Site": site} if site else {}
    with serving(config(model, tmp_path / "data")) as base, client(base, token=None) as browser:
        r = browser.get("/", params={"token": ALICE}, headers=headers)
        assert r.status_code == 303 and r.headers["location"] == "/"
        assert f"sandcell_token={ALICE}" in r.headers["set-cookie"]
        assert browser.get("/api/sessions").json() == []  # the cookie signs it in


def test_the_click_page_escapes_the_token():
    from sandcell.agent.serve.signin import click_page

    page = click_page('a"><script>x</script>', {}).body.decode()
    assert "<script>" not in page and 'value="a&quot;&gt;&lt;script&gt;' in page


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
def test_httpx_sees_the_401_of_a_whole_upload_sent_without_a_token(model, tmp_path):
    """A client that sends its whole body before reading reads the 401, not a reset: the
    server answers at once and drops the rest of the body it never reads."""
    cfg = config(model, tmp_path / "data", max_upload_mb=100)
    with serving(cfg) as base, httpx.Client(base_url=base, timeout=30) as anon:
        r = anon.post(
            f"/api/sessions/{NO_SESSION}/files", files={"file": ("a.csv", b"x" * (8 << 20))}
        )
        assert r.status_code == 401
        assert anon.get("/api/health").json() == {"status": "ok"}  # the same connection
