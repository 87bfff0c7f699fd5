"""`--allow-net` through the agent and its front ends (issue 51): the trace, the system prompt,
the message stream, a serve user's narrowing, a job's screen and audit. The cell's own battery
under each runtime and transport: tests/test_net_transports.py. Servers listen on loopback
only, named in the hosts file by the test tooling (scripts/ensure-test-hosts.sh): they are
reached through the internal: form."""

import pytest

from sandcell.sandbox import Limits
from tests.loopback import CSV, FETCH, FILES_HOST, Files, need_test_hosts, tcp_server

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.fixture(scope="module", autouse=True)
def test_hosts():
    need_test_hosts()


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
                        execute(api, sid, FETCH.format(host=FILES_HOST, port=port)).json()
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
