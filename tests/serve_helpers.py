"""A real `sandcell serve` app for tests: uvicorn on a free loopback port in a thread, the
real openai client against the scripted server, and small readers for SSE and raw paths."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from sandcell import OpenAIModel
from sandcell.agent.hosting.listening import listening_socket
from sandcell.agent.serve import ServeConfig, create_app
from sandcell.sandbox import Limits
from tests.cli_runner import free_port, sandcell_process
from tests.polling import wait_for  # noqa: F401  (the serve tests import it from here)
from tests.scripted_server import ScriptedServer

# the sales file the serve tests upload, and a cell over it: a chart, a line, a table
SALES = Path(__file__).parent / "data" / "agent" / "sales.csv"
CHART = (
    "import pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.read_csv('/data/sales.csv')\n"
    "units = df.groupby('region').units.sum()\n"
    "units.plot.bar(); plt.show()\n"
    "print(units.idxmax(), units.max())\n"
    "units.to_frame()"
)

ALICE, BOB = "alice-token-0123456789", "bob-token-9876543210"
USERS = {"alice": ALICE, "bob": BOB}


def make_users(count: int) -> dict[str, str]:
    """COUNT users (name -> token) for config(users=...) in a test of many users at once."""
    return {f"user{i}": f"user{i}-token-{i:016d}" for i in range(count)}


def config(server, data: Path, **overrides) -> ServeConfig:
    model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
    settings = {"users": USERS, "data": data, "pool": 0, "limits": Limits(timeout_s=30)}
    return ServeConfig(model=model, **{**settings, **overrides})


@contextmanager
def serving(cfg: ServeConfig) -> Iterator[str]:
    """The app under a real uvicorn on 127.0.0.1; yields its base URL. Leaving stops it the
    way a signal does (should_exit), which runs the app's shutdown: sessions and pool close."""
    app = create_app(cfg)
    sock = listening_socket("127.0.0.1", 0)  # as `sandcell serve` binds it
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=3)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(90)
        sock.close()


def client(base: str, token: str | None = ALICE) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base, headers=headers, timeout=httpx.Timeout(120, connect=10))


def new_session(api: httpx.Client) -> str:
    r = api.post("/api/sessions")
    assert r.status_code == 201, r.text
    return r.json()["id"]


def upload(api: httpx.Client, sid: str, *named: tuple[str, bytes]) -> httpx.Response:
    """POST /files with each (name, bytes) as one `file` part."""
    return api.post(f"/api/sessions/{sid}/files", files=[("file", nb) for nb in named])


def execute(api: httpx.Client, sid: str, code: str, **extra) -> httpx.Response:
    return api.post(f"/api/sessions/{sid}/execute", json={"code": code, **extra})


def events(response: httpx.Response) -> Iterator[tuple[str, dict]]:
    """(event, data) of a text/event-stream, as they arrive; comments (pings) skipped."""
    kind, data = "message", []
    for line in response.iter_lines():
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            kind = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").removeprefix(" "))


def ask(api: httpx.Client, sid: str, content: str) -> list[tuple[str, dict]]:
    with api.stream("POST", f"/api/sessions/{sid}/messages", json={"content": content}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(events(r))


def raw_get(base: str, path: str, token: str = ALICE) -> tuple[int, bytes]:
    """GET with the path sent byte for byte: no client normalises `..` or `%2e` away."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def container_of(api: httpx.Client, sid: str) -> str:
    """The session's container, by the hostname Docker gives it (its short id)."""
    r = api.post(
        f"/api/sessions/{sid}/execute", json={"code": "__import__('socket').gethostname()"}
    )
    assert r.status_code == 200, r.text
    return r.json()["results"][0]["data"]["text/plain"].strip("'")


def python(code: str) -> dict:
    return {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}


def last_tool_message(body: dict) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")


def serve_process(
    folder: Path,
    replies: list,
    *options: str,
    stderr=subprocess.PIPE,
    users: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """`sandcell serve` in its own process, as deployed: the users (alice alone by default) in
    a users file, scripted replies (--replay), sessions under FOLDER/d; (the process, its base
    URL) once it has printed its URL. Pass stderr=DEVNULL where nobody reads it (a full pipe
    blocks)."""
    users_file, script = folder / "users", folder / "replies.json"
    users_file.write_text("".join(f"{n}:{t}\n" for n, t in (users or {"alice": ALICE}).items()))
    script.write_text(json.dumps(replies))
    port = free_port()
    proc = sandcell_process(
        "serve", "--port", str(port), "--users", str(users_file), "--data", str(folder / "d"),
        "--replay", str(script), *options, stderr=stderr,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    first = proc.stdout.readline()
    if f"API at {base}/api/" not in first:
        proc.kill()
        raise AssertionError(
            f"the server did not start: {first}{proc.stderr and proc.stderr.read()}"
        )
    return proc, base


@pytest.fixture
def model():
    """A scripted OpenAI-compatible server (tests.scripted_server) for one test."""
    with ScriptedServer() as server:
        yield server
