"""`--allow-net` in real containers (issue 51): under runc and runsc a cell reaches an allowed
server on this host through the proxy (the container still has no interface but loopback),
is refused any other host in one line, cannot open a raw socket to the allowed server, and
is cut at its byte cap; the host keeps a record of each connection. Servers listen on
loopback only; they are named by IP literal in the internal: form."""

import http.server

import pytest

from sandcell.sandbox import DockerSandbox, Limits, SandboxError
from sandcell.sandbox.checkpoint import PauseError
from sandcell.sandbox.docker_sandbox import NET_STREAMED
from tests.loopback import tcp_server

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]
CSV = b"region,amount\nnorth,10\nsouth,32\n"


class Files(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = CSV if self.path.endswith(".csv") else b"x" * (3 << 20)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


CELL = """
import socket, urllib.error, urllib.request, pandas as pd
print(pd.read_csv('http://127.0.0.1:{port}/sales.csv').amount.sum())
try:
    urllib.request.urlopen('http://data.example.org/sales.csv', timeout=20)
except urllib.error.HTTPError as error:
    print(error.code, error.reason)
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=5)
    print('raw socket connected')
except OSError as error:
    print('raw socket:', type(error).__name__)
try:
    urllib.request.urlopen('http://127.0.0.1:{port}/big', timeout=30).read()
    print('whole download')
except Exception as error:
    print('download cut:', type(error).__name__)
"""


def test_a_cell_reaches_the_allowed_host_only_through_the_proxy_and_is_cut_at_its_cap(runtime):
    with tcp_server(Files) as port:
        limits = Limits(allow_net=(f"internal:127.0.0.1:{port}",), net_mb=1, runtime=runtime)
        with DockerSandbox(limits=limits) as sb:
            ex = sb.run(CELL.format(port=port), timeout=60)
            assert ex.ok, ex
            assert [(c["host"], c["allowed"]) for c in ex.net] == [
                ("127.0.0.1", True), ("data.example.org", False), ("127.0.0.1", True)
            ]  # fmt: skip
            with pytest.raises(PauseError, match="not paused yet"):
                sb.pause(sb.conn_dir + "-paused")  # says why, and runs on
            assert sb.run("1 + 1").text == "2"
            records = list(sb.net_connections)
    assert ex.stdout.splitlines() == [
        "42",
        f"403 not allowed: data.example.org:80; this sandbox may reach: internal:127.0.0.1:{port}",
        "raw socket: ConnectionRefusedError",
        "download cut: IncompleteRead",
    ], ex.stdout
    fetched, refused, cut = records
    assert (fetched.host, fetched.address, fetched.allowed, fetched.received > len(CSV)) == (
        "127.0.0.1", "127.0.0.1", True, True
    )  # fmt: skip
    assert (refused.host, refused.port, refused.allowed) == ("data.example.org", 80, False)
    assert cut.allowed and cut.reason == "cut at this sandbox's 1 MB of network"
    assert fetched.received + fetched.sent + cut.received + cut.sent <= 1 << 20


def test_allow_net_needs_the_ipc_transport_for_now():
    with pytest.raises(SandboxError) as refused:
        DockerSandbox(limits=Limits(allow_net=("data.example.org",), transport="stream"))
    assert str(refused.value) == NET_STREAMED


def test_an_agent_s_trace_holds_each_connection_and_its_prompt_names_the_hosts(tmp_path):
    from sandcell import Agent, OpenAIModel, Rules
    from sandcell.agent.records.trace import read_trace
    from tests.scripted_server import ScriptedServer

    with tcp_server(Files) as port:
        code = (
            f"import pandas as pd\nprint(pd.read_csv('http://127.0.0.1:{port}/s.csv').amount.sum())"
        )
        script = [{"tool_calls": [{"name": "python", "arguments": {"code": code}}]}, "It is 42."]
        with ScriptedServer(script) as server:
            model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
            limits = Limits(allow_net=(f"internal:127.0.0.1:{port}",))
            agent = Agent(model, rules=Rules(), protocol="tools", limits=limits)
            result = agent.run("Sum the amounts", output_dir=tmp_path)
    assert result.answered, result
    system = server.requests[0]["messages"][0]["content"]
    assert f"(network: only HTTP(S) to 127.0.0.1:{port}, through its proxy;" in system
    (net,) = [e for e in read_trace(result.trace_path) if e["type"] == "net"]
    assert (net["host"], net["port"], net["allowed"], net["address"]) == (
        "127.0.0.1", port, True, "127.0.0.1"
    )  # fmt: skip


def test_the_message_stream_shows_each_connection_as_a_net_event(tmp_path):
    from tests.scripted_server import ScriptedServer
    from tests.serve_helpers import ask, client, config, new_session, serving

    with tcp_server(Files) as port:
        code = (
            f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/s.csv').read()"
        )
        script = [{"tool_calls": [{"name": "python", "arguments": {"code": code}}]}, "Read."]
        limits = Limits(timeout_s=30, allow_net=(f"internal:127.0.0.1:{port}",))
        with (
            ScriptedServer(script) as server,
            serving(config(server, tmp_path / "data", limits=limits)) as base,
            client(base) as api,
        ):
            got = ask(api, new_session(api), "read it")
    nets = [data for kind, data in got if kind == "net"]
    assert [(n["host"], n["port"], n["allowed"]) for n in nets] == [("127.0.0.1", port, True)]
    kinds = [kind for kind, _ in got]
    assert kinds.index("observation") < kinds.index("net") < kinds.index("answer")
