"""`--allow-net` in real containers (issue 51): under runc and runsc a cell reaches an allowed
HTTP and HTTPS server on this host through the proxy (the container still has no interface but
loopback) with urllib, requests and pandas, is refused any other host in one line, cannot open
a raw socket or look a name up itself, and is cut at its byte cap; the host keeps a record of
each connection. Servers listen on loopback only, named in the hosts file by the test tooling
(scripts/ensure-test-hosts.sh): they are reached through the internal: form."""

import ssl
from dataclasses import asdict

import pytest
import trustme

from sandcell.sandbox import DockerSandbox, Limits, SandboxError
from sandcell.sandbox.checkpoint import PauseError
from sandcell.sandbox.docker_sandbox import NET_STREAMED
from tests.loopback import (
    CSV,
    FILES_HOST,
    OTHER_HOST,
    PRIVATE_HOST,
    Files,
    need_test_hosts,
    tcp_server,
)

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", autouse=True)
def test_hosts():
    need_test_hosts()


@pytest.fixture(scope="module")
def servers():
    """The files, over HTTP and over HTTPS (a certificate of a test CA the cells trust):
    ({"plain": port, "tls": port}, the CA's PEM)."""
    ca = trustme.CA()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(FILES_HOST, OTHER_HOST).configure_cert(tls)
    with tcp_server(Files) as plain, tcp_server(Files, tls) as secure:
        yield {"plain": plain, "tls": secure}, ca.cert_pem.bytes().decode()


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
print(said(lambda: socket.getaddrinfo('{files}', {plain})))
print(said(lambda: urllib.request.urlopen(plain + '/big', timeout=30).read()))
"""


def test_a_cell_reaches_the_allowed_hosts_only_through_the_proxy_and_is_cut_at_its_cap(
    runtime, servers
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
        with pytest.raises(PauseError, match="not paused yet"):
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
        "gaierror: [Errno -3] Temporary failure in name resolution",
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
        (FILES_HOST, ports["plain"], True),
    ]
    assert [asdict(r) for r in records] == ex.net
    cut = records[-1]
    assert (cut.address, cut.reason) == ("127.0.0.1", "cut at this sandbox's 1 MB of network")
    assert sum(r.sent + r.received for r in records) <= 1 << 20
    assert all(r.received > len(CSV) for r in records[:4])  # the TLS ones: their handshakes too


def test_allow_net_needs_the_ipc_transport_for_now():
    with pytest.raises(SandboxError) as refused:
        DockerSandbox(limits=Limits(allow_net=("data.example.org",), transport="stream"))
    assert str(refused.value) == NET_STREAMED


def test_an_agent_s_trace_holds_each_connection_and_its_prompt_names_the_hosts(tmp_path):
    from sandcell import Agent, OpenAIModel, Rules
    from sandcell.agent.records.trace import read_trace
    from tests.scripted_server import ScriptedServer

    with tcp_server(Files) as port:
        code = f"import pandas as pd\nprint(pd.read_csv('http://{FILES_HOST}:{port}/s.csv').amount.sum())"
        script = [{"tool_calls": [{"name": "python", "arguments": {"code": code}}]}, "It is 42."]
        with ScriptedServer(script) as server:
            model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
            limits = Limits(allow_net=(f"internal:{FILES_HOST}:{port}",))
            agent = Agent(model, rules=Rules(), protocol="tools", limits=limits)
            result = agent.run("Sum the amounts", output_dir=tmp_path)
    assert result.answered, result
    system = server.requests[0]["messages"][0]["content"]
    assert f"(network: only HTTP(S) to {FILES_HOST}:{port}, through its proxy;" in system
    (net,) = [e for e in read_trace(result.trace_path) if e["type"] == "net"]
    assert (net["host"], net["port"], net["allowed"], net["address"]) == (
        FILES_HOST, port, True, "127.0.0.1"
    )  # fmt: skip


def test_the_message_stream_shows_each_connection_as_a_net_event(tmp_path):
    from tests.scripted_server import ScriptedServer
    from tests.serve_helpers import ask, client, config, new_session, serving

    with tcp_server(Files) as port:
        code = f"import urllib.request\nurllib.request.urlopen('http://{FILES_HOST}:{port}/s.csv').read()"
        script = [{"tool_calls": [{"name": "python", "arguments": {"code": code}}]}, "Read."]
        limits = Limits(timeout_s=30, allow_net=(f"internal:{FILES_HOST}:{port}",))
        with (
            ScriptedServer(script) as server,
            serving(config(server, tmp_path / "data", limits=limits)) as base,
            client(base) as api,
        ):
            got = ask(api, new_session(api), "read it")
    nets = [data for kind, data in got if kind == "net"]
    assert [(n["host"], n["port"], n["allowed"]) for n in nets] == [(FILES_HOST, port, True)]
    kinds = [kind for kind, _ in got]
    assert kinds.index("observation") < kinds.index("net") < kinds.index("answer")


def test_a_user_s_line_narrows_the_server_s_allowlist_for_their_sessions_only(tmp_path):
    """serve --allow-net A,B with alice's line narrowed to A: her session (its sandbox from the
    warm pool, made with A and B) is refused B in one line naming A alone; bob's reaches both."""
    from tests.scripted_server import ScriptedServer
    from tests.serve_helpers import BOB, client, config, execute, new_session, serving

    fetch = "import urllib.request\ntry:\n    urllib.request.urlopen('http://{h}:{p}/x.csv')\n    print('fetched')\nexcept Exception as e:\n    print(e)"
    with tcp_server(Files) as first, tcp_server(Files) as second, ScriptedServer([]) as server:
        a, b = f"internal:{FILES_HOST}:{first}", f"internal:{FILES_HOST}:{second}"
        limits = Limits(timeout_s=30, allow_net=(a, b))
        cfg = config(
            server, tmp_path / "data", limits=limits, pool=1, user_allow_net={"alice": (a,)}
        )
        with serving(cfg) as base:
            said = {}
            for name, token in [("alice", None), ("bob", BOB)]:
                with client(base, token) if token else client(base) as api:
                    sid = new_session(api)
                    runs = [
                        execute(api, sid, fetch.format(h=FILES_HOST, p=port)).json()
                        for port in (first, second)
                    ]
                    said[name] = ["".join(s["text"] for s in run["stream"]) for run in runs]
    assert said["alice"] == [
        "fetched\n",
        f"HTTP Error 403: not allowed: {FILES_HOST}:{second}; this sandbox may reach: {a}\n",
    ], said
    assert said["bob"] == ["fetched\n", "fetched\n"], said


def test_a_job_s_audit_and_its_screen_show_each_connection(tmp_path):
    """`sandcell run --allow-net`: the screen has a line per connection (a refused one in its
    own words), audit.json counts and lists them, answer.md's Audit section says them."""
    import json
    import os
    import re

    from tests.cli_runner import sandcell_terminal

    with tcp_server(Files) as port:
        code = (
            "import pandas as pd, urllib.request\n"
            f"pd.read_csv('http://{FILES_HOST}:{port}/s.csv').to_csv('output/s.csv', index=False)\n"
            "try:\n    urllib.request.urlopen('http://data.example.org/x.csv')\n"
            "except Exception as error:\n    print(error)"
        )
        script = [
            {"tool_calls": [{"name": "python", "arguments": {"code": code}}]},
            {"content": "Final Answer: copied."},
        ]
        (tmp_path / "script.json").write_text(json.dumps(script))
        out = tmp_path / "out"
        allow = f"internal:{FILES_HOST}:{port}"
        child = sandcell_terminal(
            "run", "--task", "copy it", "--output", str(out), "--replay",
            str(tmp_path / "script.json"), "--allow-net", allow,
            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "250"}, timeout=150,
        )  # fmt: skip
        screen = re.sub(r"\x1b\[[0-9;]*m", "", child.read().decode())
        child.close()
    assert child.exitstatus == 0, screen
    assert f"net: connection to {FILES_HOST}:{port} (127.0.0.1): " in screen, screen
    assert (
        "net: connection to data.example.org:80 refused: not allowed: data.example.org:80; "
        f"this sandbox may reach: {allow}\r\n"
    ) in screen, screen
    network = json.loads((out / "audit.json").read_text())["network"]
    assert (network["allowed"], network["refused"]) == (1, 1), network
    assert network["received"] > len(CSV) and network["sent"] > 0
    assert [(c["host"], c["allowed"]) for c in network["connections"]] == [
        (FILES_HOST, True), ("data.example.org", False)
    ]  # fmt: skip
    answer = (out / "answer.md").read_text()
    assert "- Network: 1 connection (" in answer and ", 1 refused\n" in answer, answer
    assert "  - connection to data.example.org:80 refused: not allowed" in answer, answer
