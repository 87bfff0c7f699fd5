"""`sandcell mcp` end to end: the real command in a subprocess, real sandboxes, and the MCP
SDK's own client (stdio_client, streamable_http_client + ClientSession); no JSON-RPC by hand."""

import base64
import hashlib
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from click.testing import CliRunner
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.types import CancelledNotification, CancelledNotificationParams, ClientNotification
from prometheus_client.parser import text_string_to_metric_families

from sandcell.agent.cli import main
from sandcell.agent.mcp.definitions import definitions
from sandcell.sandbox import BackgroundSandbox, Inputs, Limits, Sandbox
from sandcell.tools import Registry, calculator_tool, file_metadata_tool, python_tool
from tests.cli_runner import sandcell_process
from tests.containers import container_labels, owner_label
from tests.mcp_helpers import bearer, http_session, over_stdio, python, start_http, text
from tests.serve_helpers import ALICE, BOB, wait_for

TOOLS = {"run_python", "describe_file", "list_files", "read_file", "write_file"}
TOOLS |= {"calculator", "export_outputs"}


# -- stdio --------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_stdio_tools_state_charts_errors_and_bad_arguments():
    async def scenario(session):
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(listed) == TOOLS
        for tool in listed.values():
            assert tool.description and len(tool.description) > 40, tool.name
            assert tool.inputSchema["type"] == "object"
        run = listed["run_python"].inputSchema
        assert run["required"] == ["code"] and run["properties"]["code"]["type"] == "string"
        assert run["properties"]["timeout_s"]["anyOf"][0]["maximum"] == 30  # --timeout
        assert listed["write_file"].inputSchema["required"] == ["path", "content"]
        assert listed["list_files"].inputSchema.get("required", []) == []

        assert not (await python(session, "x = 21")).isError
        answer = await python(session, "x * 2")
        assert not answer.isError and text(answer) == "42"

        chart = await python(
            session, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
        )
        images = [c for c in chart.content if c.type == "image"]
        assert not chart.isError and len(images) == 1 and images[0].mimeType == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
        assert "/workspace/figures/" in text(chart)

        raised = await python(session, "1 / 0")
        assert raised.isError and "ZeroDivisionError: division by zero" in text(raised)

        for bad in ({"code": 1}, {}, {"code": "1", "timeout_s": -1}, {"code": "1", "x": 2}):
            refused = await session.call_tool("run_python", bad)
            assert refused.isError, bad
        worded = text(await session.call_tool("run_python", {"code": 7}))
        assert worded == "run_python: `code` must be a string, got number", worded
        extra = text(await session.call_tool("run_python", {"code": "1", "x": 2}))
        assert "unknown argument(s) `x`" in extra, extra
        assert text(await python(session, "x")) == "21"  # state kept through all of it

        calc = await session.call_tool("calculator", {"expression": "2^10 + 4 * 1,000"})
        assert not calc.isError and text(calc) == "5024"
        nowhere = await session.call_tool("export_outputs", {})
        assert nowhere.isError and "--output DIR" in text(nowhere)

    over_stdio(scenario, "--timeout", "30")


# What the agent calls each of its tools over MCP (the README's table names them so)
AGENT_TOOLS = {"run_python": "python", "describe_file": "file_metadata", "calculator": "calculator"}
MCP_NAME = {agent: mcp for mcp, agent in AGENT_TOOLS.items()}


def mcp_spelling(description: str) -> str:
    """An agent description with the tools it names spelled as MCP clients know them."""
    return re.sub(r"\b(python|file_metadata)\b", lambda m: MCP_NAME[m[1]], description)


def never_started() -> Sandbox:
    raise AssertionError("only the tools' definitions are read: no sandbox is needed")


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_listed_tools_are_the_agent_definitions_so_they_cannot_drift():
    """Each tool the agent has too is listed with the agent's own description (at most an MCP
    note after it) and schema (at most optional MCP-only arguments beside it); the file tools,
    which the agent has not, come from agent.mcp.definitions and nowhere else."""
    agent_sandbox = BackgroundSandbox(
        never_started, Limits(), Inputs.from_paths([]), background=False
    )
    agent = Registry([python_tool(agent_sandbox), file_metadata_tool(), calculator_tool])
    mcp_only = {tool.name: tool for tool in definitions(Limits(timeout_s=30))}

    async def scenario(session):
        return (await session.list_tools()).tools

    listed = over_stdio(scenario, "--timeout", "30")
    assert {tool.name for tool in listed} == TOOLS
    for tool in listed:
        if tool.name not in AGENT_TOOLS:
            own = mcp_only[tool.name]
            assert (tool.description, tool.inputSchema) == (own.description, own.inputSchema)
            continue
        spec = agent.get(AGENT_TOOLS[tool.name]).spec
        said = mcp_spelling(spec.description)
        assert tool.description == said or tool.description.startswith(said + " "), tool.name
        schema, theirs = tool.inputSchema, spec.parameters
        assert {k: v for k, v in schema.items() if k != "properties"} == {
            k: v for k, v in theirs.items() if k != "properties"
        }, tool.name
        for arg, arg_schema in theirs["properties"].items():
            assert schema["properties"][arg] == arg_schema, (tool.name, arg)
        extra = set(schema["properties"]) - set(theirs["properties"])
        assert extra == ({"timeout_s"} if tool.name == "run_python" else set()), tool.name


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_stdio_a_cells_output_comes_as_progress_while_it_runs():
    """A client that asks for progress gets the cell's stdout as it is printed (Output
    events, each a progress notification), before the call's result."""
    got: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        got.append((time.monotonic(), message or ""))

    code = (
        "import time\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.5)"
    )

    async def scenario(session):
        result = await session.call_tool(
            "run_python", {"code": code}, progress_callback=on_progress
        )
        return time.monotonic(), result

    done, result = over_stdio(scenario, "--timeout", "30")
    assert not result.isError and text(result) == "line 0\nline 1\nline 2"
    assert "".join(m for _, m in got) == "line 0\nline 1\nline 2\n"
    assert got[0][0] < done - 0.8  # the first line came while the cell still ran


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_stdio_an_endless_loop_times_out_within_the_grace_and_the_network_is_absent():
    async def scenario(session):
        await python(session, "kept = 5")
        started = time.monotonic()
        stuck = await python(session, "while True:\n    pass", timeout_s=2)
        took = time.monotonic() - started
        # the text names the time the cell took: its 2 s deadline and the interrupt's delivery
        assert stuck.isError and re.search(r"Timed out after \d+ s", text(stuck)), text(stuck)
        assert took < 2 + 3 + 15, took  # the deadline, the interrupt grace, a loaded machine
        assert text(await python(session, "kept + 1")) == "6"  # the next call works

        fetched = await python(
            session,
            "import urllib.request\nurllib.request.urlopen('http://1.1.1.1', timeout=3)",
        )
        assert fetched.isError and "offline by design" in text(fetched)
        probe = await python(
            session,
            "import socket\ns = socket.socket()\ntry:\n    s.connect(('1.1.1.1', 80))\n"
            "except OSError as e:\n    print(type(e).__name__, e.errno)",
        )
        assert "Network is unreachable" in text(probe) or "101" in text(probe), text(probe)

    over_stdio(scenario)


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_stdio_files_inputs_are_read_only_and_exports_reach_the_output_folder(tmp_path):
    data = tmp_path / "sales.csv"
    data.write_text("region,amount\nnorth,10\nsouth,32\n")
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    out = tmp_path / "out"

    async def scenario(session):
        call = session.call_tool
        profile = await call("describe_file", {"path": "/data/sales.csv"})
        assert not profile.isError and "region" in text(profile) and "2 rows" in text(profile)

        wrote = await call("write_file", {"path": "output/note.txt", "content": "héllo"})
        assert not wrote.isError and "/workspace/output/note.txt" in text(wrote)
        made = await python(
            session,
            "import pandas as pd\ndf = pd.read_csv('/data/sales.csv')\n"
            "df.to_csv('/workspace/output/total.csv', index=False)\nopen('/data/sales.csv', 'a')",
        )
        assert made.isError and ("Read-only" in text(made) or "Permission" in text(made))

        listing = (await call("list_files", {})).structuredContent
        paths = {f["path"]: f for f in listing["files"]}
        assert paths["/data/sales.csv"]["read_only"] is True
        assert {"/workspace/output/note.txt", "/workspace/output/total.csv"} <= set(paths)

        read = (await call("read_file", {"path": "/workspace/output/note.txt"})).structuredContent
        assert read == {
            "path": "/workspace/output/note.txt",
            "encoding": "utf-8",
            "content": "héllo",
            "truncated": False,
        }
        cut = await call("read_file", {"path": "/data/sales.csv", "max_bytes": 6})
        assert cut.structuredContent["content"] == "region" and cut.structuredContent["truncated"]
        await python(session, "open('/workspace/blob.bin', 'wb').write(bytes(range(256)))")
        blob = (await call("read_file", {"path": "blob.bin"})).structuredContent
        assert blob["encoding"] == "base64"
        assert base64.b64decode(blob["content"]) == bytes(range(256))

        for tool, args in [
            ("read_file", {"path": "/etc/passwd"}),
            ("read_file", {"path": "/workspace/../etc/passwd"}),
            ("write_file", {"path": "/data/sales.csv", "content": "x"}),
            ("write_file", {"path": "/tmp/x", "content": "x"}),
            ("read_file", {"path": "/workspace/output/note.txt", "max_bytes": 0}),
        ]:
            assert (await call(tool, args)).isError, (tool, args)

        exported = await call("export_outputs", {})
        assert not exported.isError
        files = sorted(exported.structuredContent["files"])
        assert files == [str(out / "note.txt"), str(out / "total.csv")]
        assert (out / "total.csv").read_text().splitlines()[1] == "north,10"

    over_stdio(scenario, "--input", str(data), "--output", str(out))
    assert hashlib.sha256(data.read_bytes()).hexdigest() == digest  # inputs never modified


async def cancelled_slow_cell(session) -> list:
    """A 30 s cell whose call the client cancels after 2 s: what the call got."""
    request_id = session._request_id  # the SDK numbers requests; the next one's id
    slow = "import time\nfor _ in range(300):\n    time.sleep(0.1)\nfinished = True"
    outcome = []

    async def call():
        try:
            outcome.append(await python(session, slow))
        except McpError as error:
            outcome.append(error.error.message)

    async with anyio.create_task_group() as calls:
        calls.start_soon(call)
        await anyio.sleep(2)
        cancel = CancelledNotification(
            params=CancelledNotificationParams(requestId=request_id, reason="test")
        )
        await session.send_notification(ClientNotification(cancel))
    return outcome


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_stdio_a_cancelled_call_interrupts_its_cell():
    async def scenario(session):
        await python(session, "kept = 1")
        assert await cancelled_slow_cell(session) == ["Request cancelled"]
        started = time.monotonic()
        after = await python(session, "('finished' in globals(), kept)")
        assert text(after) == "(False, 1)"  # interrupted, not finished; state kept
        assert time.monotonic() - started < 10  # not waiting out the 30 s cell

    over_stdio(scenario)


CLIENT = """
import anyio, os, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import McpError
from mcp.types import CancelledNotification, CancelledNotificationParams, ClientNotification

async def main():
    server = StdioServerParameters(command=sys.executable, args=["-m", "sandcell.agent.cli", "mcp"],
                                   env=dict(os.environ))
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("run_python", {"code": "1 + 1"})
        print("ready", result.content[0].text, flush=True)
        await anyio.sleep(600)

anyio.run(main)
"""


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_ending_the_client_process_leaves_no_container(tmp_path):
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(CLIENT))
    client = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "ready 2"
        (server,) = psutil.Process(client.pid).children(recursive=True)
        label = owner_label(server.pid)
        assert len(container_labels(label)) == 1
        client.kill()  # no goodbye: the server sees its stdin end
        client.wait(10)
        server.wait(60)
        assert container_labels(label) == []
    finally:
        client.kill()


@pytest.mark.docker
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_stdio_server_on_sigterm_or_ctrl_c_removes_its_container(sig, status):
    proc = sandcell_process("mcp", stdin=subprocess.PIPE, text=False)
    try:
        # its sandbox (the transport probe's container, before it, is a helper)
        wait_for(lambda: len(container_labels("sandcell", owner_label(proc.pid))) == 1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == status, err
    assert out == b"" and b"Traceback" not in err  # stdout is the protocol's alone
    assert container_labels(owner_label(proc.pid)) == []


def test_usage_errors_are_one_line():
    runner = CliRunner()
    users = runner.invoke(main, ["mcp", "--users", __file__], prog_name="sandcell")
    assert users.exit_code == 2 and "--users is for --http" in users.stderr
    port = runner.invoke(main, ["mcp", "--port", "9000"], prog_name="sandcell")
    assert port.exit_code == 2 and "--port is for --http" in port.stderr
    named = runner.invoke(main, ["mcp", "--allowed-host", "a.test"], prog_name="sandcell")
    assert named.exit_code == 2 and "--allowed-host is for --http" in named.stderr
    ray = runner.invoke(main, ["mcp", "--ray", "127.0.0.1:1"], prog_name="sandcell")
    assert ray.exit_code == 2 and "--ray is for --http" in ray.stderr
    missing = runner.invoke(main, ["mcp", "--input", "/nonexistent.csv"], prog_name="sandcell")
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    for result in (users, port, ray, missing):
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "Traceback" not in result.stderr


def test_export_never_replaces_an_input_or_files_already_in_the_output_folder(tmp_path):
    data = tmp_path / "in.csv"
    data.write_text("a\n1\n")
    runner = CliRunner()
    over = runner.invoke(
        main, ["mcp", "--input", str(data), "--output", str(tmp_path), "--overwrite"]
    )
    assert over.exit_code == 2 and "holds an --input file" in over.stderr
    assert data.read_text() == "a\n1\n"
    full = tmp_path / "out"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    kept = runner.invoke(main, ["mcp", "--output", str(full)])
    assert kept.exit_code == 2 and "is not empty" in kept.stderr and "--overwrite" in kept.stderr


# -- streamable HTTP ----------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_http_sessions_are_isolated_need_a_token_and_sigterm_removes_every_container(tmp_path):
    out, data = tmp_path / "out", tmp_path / "sales.csv"
    data.write_text("region,amount\nnorth,10\n")
    proc, url = start_http(tmp_path, "--output", str(out), "--input", str(data))
    label = owner_label(proc.pid)

    async def scenario():
        async with http_session(url, ALICE) as (alice, alice_id):
            async with http_session(url, BOB) as (bob, _):
                async with anyio.create_task_group() as both:  # at once, each its own kernel
                    both.start_soon(python, alice, "secret = 'alice'")
                    both.start_soon(python, bob, "import time; time.sleep(0.5); other = 1")
                assert text(await python(alice, "secret")) == "'alice'"
                inputs = await python(bob, "open('/data/sales.csv').read().splitlines()[1]")
                assert text(inputs) == "'north,10'"  # --input reaches every session
                unseen = await python(bob, "secret")
                assert unseen.isError and "NameError" in text(unseen)
                assert len(container_labels(label)) == 3  # two sessions and the warm one

                # Bob holding Alice's session id is refused, as if it did not exist
                async with httpx.AsyncClient() as raw:
                    stolen = await raw.post(
                        url,
                        json={},
                        headers={
                            **bearer(BOB),
                            "mcp-session-id": alice_id,
                            "accept": "application/json, text/event-stream",
                        },
                    )
                assert stolen.status_code == 404
            # Bob's session ended: its container goes (the pool refills to one warm)
            wait_for(lambda: len(container_labels(label)) == 2)
            assert text(await python(alice, "secret")) == "'alice'"
            await python(alice, "open('/workspace/output/a.txt', 'w').write(secret)")
            (exported,) = (await alice.call_tool("export_outputs", {})).structuredContent["files"]
            assert exported.startswith(f"{out}/") and exported.endswith("/a.txt")  # DIR/<id>/
            assert Path(exported).read_text() == "alice"
            assert await cancelled_slow_cell(alice) == ["Request cancelled"]  # interrupted
            assert text(await python(alice, "'finished' in globals()")) == "False"

    try:
        for headers in ({}, bearer("not-a-token-of-this-server")):
            refused = httpx.post(url, json={}, headers=headers)
            assert refused.status_code == 401, headers
            assert refused.headers["www-authenticate"].startswith("Bearer")
        anyio.run(scenario)
        check_metrics(url.removesuffix("/mcp") + "/metrics")

        signalled = []

        async def hold_one_open():  # SIGTERM while a session and its sandbox are live
            async with http_session(url, ALICE) as (session, _):
                assert text(await python(session, "1 + 1")) == "2"
                wait_for(lambda: len(container_labels(label)) == 2)
                proc.send_signal(signal.SIGTERM)
                signalled.append(True)
                with anyio.move_on_after(60):
                    while proc.poll() is None:
                        await anyio.sleep(0.1)

        try:
            anyio.run(hold_one_open)
        except Exception:  # the client's goodbye finds no server: only after the signal
            if not signalled:
                raise
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert container_labels(label) == []


OUTCOMES = ("ok", "error", "interrupted", "timeout", "restarted")


def check_metrics(metrics_url: str) -> None:
    """/metrics: the API's token (the guard's, not the SDK's); the cells the sessions ran (one
    a NameError, one its client cancelled), the refused tokens (three, this one's too), the
    route as its template."""
    assert httpx.get(metrics_url).status_code == 401
    scraped = httpx.get(metrics_url, headers=bearer(ALICE))
    assert scraped.status_code == 200, scraped.text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scraped.text)
        for s in family.samples
    }
    cells = "sandcell_cell_duration_seconds_count"
    counted = {outcome: samples[(cells, (("outcome", outcome),))] for outcome in OUTCOMES}
    assert counted == {"ok": 7, "error": 1, "interrupted": 1, "timeout": 0, "restarted": 0}
    assert samples[("sandcell_rejections_total", (("reason", "auth"),))] == 3
    routes = {
        dict(labels).get("route") for name, labels in samples if name.startswith("sandcell_http")
    }
    assert routes == {"/mcp", "/metrics"}, routes


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_http_a_session_its_client_left_ends_after_the_idle_time_with_its_container(tmp_path):
    proc, url = start_http(tmp_path, "--idle-minutes", "0.05", "--pool", "0")  # 3 s
    label = owner_label(proc.pid)

    async def leave_without_ending():
        async with http_session(url, ALICE, end=False) as (session, _):
            assert text(await python(session, "1 + 1")) == "2"

    try:
        anyio.run(leave_without_ending)
        assert len(container_labels(label)) == 1  # the session is still there
        wait_for(lambda: container_labels(label) == [], seconds=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_http_refuses_another_host_name_or_origin_and_allowed_host_adds_a_name(tmp_path):
    proc, url = start_http(tmp_path, "--allowed-host", "mcp.test", "--pool", "0")
    port = url.rsplit(":", 1)[1].split("/")[0]
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "1"}}}  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream"}
    named = {"Host": f"mcp.test:{port}"}

    async def through_the_allowed_name():
        headers = {**bearer(ALICE), **named}
        async with (
            httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=300)) as http,
            streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert text(await python(session, "1 + 1")) == "2"

    try:
        with httpx.Client(headers={**bearer(ALICE), **accept}, timeout=30) as http:
            r = http.post(url, json=init, headers={"Host": f"evil.example:{port}"})
            assert r.status_code == 403 and "--allowed-host evil.example" in r.json()["error"]
            for method in ("POST", "GET"):  # MCP: every request's Origin is checked
                r = http.request(method, url, json=init, headers={"Origin": "http://evil.example"})
                assert r.status_code == 403 and "another site" in r.json()["error"], method
            r = http.post(url, json=init, headers={"Authorization": "Bearer nope", **named})
            assert r.status_code == 401  # the name is allowed, the token is not
            own = {**named, "Origin": f"http://mcp.test:{port}"}
            assert http.post(url, json=init, headers=own).status_code == 200
        anyio.run(through_the_allowed_name)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
