"""A served session keeps its kernel (issue 40): under gVisor an idle session pauses (its
container checkpointed into the session folder, then removed) and the next cell resumes it;
a stopping server pauses every live session and a restarted one resumes them with no replay.
Whatever goes wrong (a tampered checkpoint, a user's disk budget) falls back to what runc
sessions do, the warning says why, and nothing is lost. Real runsc containers, real servers."""

from __future__ import annotations

import json
import signal
import stat
import time

import docker
import docker.errors
import pytest

from sandcell.sandbox import Limits
from tests.containers import container_labels, owner_label
from tests.missing import cannot_run
from tests.serve_helpers import (  # noqa: F401 (model: a fixture)
    SALES,
    client,
    config,
    container_of,
    execute,
    model,
    new_session,
    raw_get,
    serve_process,
    serving,
    upload,
    wait_for,
)
from tests.test_pause import checkpoints_problem

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]
RUNSC = Limits(timeout_s=60, memory_mb=1024, runtime="runsc")
STATE = (
    "import random, pandas as pd\n"
    "df = pd.read_csv('/data/sales.csv')\n"
    "drawn = random.random()\n"
    "open('/workspace/kept.txt', 'w').write('kept')\n"
    "open('/tmp/scratch.txt', 'w').write('scratch')\n"
    "drawn"
)
BACK = "drawn, len(df), open('/workspace/kept.txt').read(), open('/tmp/scratch.txt').read()"


@pytest.fixture(autouse=True)
def runsc():
    problem = checkpoints_problem()
    if problem:
        cannot_run(problem, "pause test")


def value(response) -> str:
    body = response.json()
    assert body["error"] is None, body
    return next(r for r in body["results"] if r["is_main"])["data"]["text/plain"]


def trace(api, sid: str) -> list[dict]:
    return [json.loads(x) for x in api.get(f"/api/sessions/{sid}/trace").text.splitlines()]


def idling(model, data, **more):
    """A server whose sessions go idle after 3 s (and which pauses none as it stops)."""
    return serving(config(model, data, limits=RUNSC, idle_minutes=0.05, stop_grace_s=0, **more))


def sandbox_of(api, sid: str) -> str:
    return api.get(f"/api/sessions/{sid}").json()["sandbox"]


def runsc_server(tmp_path, grace: str):
    """`sandcell serve --runtime runsc` in its own process, with this --stop-grace."""
    return serve_process(tmp_path, ["Final Answer: hello"], "--runtime", "runsc", "--pool", "0",
                         "--stop-grace", grace)  # fmt: skip


def started(api, sid: str) -> str:
    """The session's state set (STATE); the value drawn."""
    assert upload(api, sid, ("sales.csv", SALES.read_bytes())).status_code == 201
    return value(execute(api, sid, STATE))


def test_an_idle_session_pauses_and_its_next_cell_finds_every_variable(model, tmp_path):
    data = tmp_path / "d"
    with idling(model, data) as base, client(base) as api:
        sid = new_session(api)
        drawn = started(api, sid)
        first = container_of(api, sid)
        wait_for(lambda: sandbox_of(api, sid) == "paused", 60)
        with pytest.raises(docker.errors.NotFound):
            docker.from_env().containers.get(first)
        paused = data / "alice" / sid / ".paused"
        assert stat.S_IMODE(paused.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in paused.rglob("*"))
        # the checkpoint holds the kernel's memory: no route gives it out
        for path in (".paused/pause.json", ".paused/checkpoint", "%2epaused/pause.json"):
            assert raw_get(base, f"/api/sessions/{sid}/files/{path}")[0] == 404
        assert ".paused" not in api.get(f"/api/sessions/{sid}/files").text

        r = execute(api, sid, BACK)
        assert value(r) == f"({drawn}, 12, 'kept', 'scratch')"  # the same draw: no replay
        assert "x-sandcell-warning" not in r.headers
        assert not paused.exists()  # the kernel moved on from it
        kinds = [e["type"] for e in trace(api, sid)]
        # (a sandbox released before any cell ran may come first: nothing was in it)
        since = kinds[kinds.index("sandbox_paused") :]
        assert since[:2] == ["sandbox_paused", "sandbox_resumed"], kinds
        assert "reset" not in since and "rebuilt" not in since
        resumed = [e for e in trace(api, sid) if e["type"] == "sandbox_resumed"]
        assert [e.get("error") for e in resumed] == [None]
        print([(e["seconds"], e.get("size")) for e in trace(api, sid) if "seconds" in e])

        # paused again, then deleted: the checkpoint goes with the session
        wait_for(lambda: sandbox_of(api, sid) == "paused", 60)
        assert paused.is_dir()
        assert api.delete(f"/api/sessions/{sid}").status_code == 204
        assert not (data / "alice" / sid).exists()


def test_a_tampered_checkpoint_falls_back_to_a_fresh_kernel_and_says_why(model, tmp_path):
    data = tmp_path / "d"
    with idling(model, data) as base, client(base) as api:
        sid = new_session(api)
        started(api, sid)
        wait_for(lambda: sandbox_of(api, sid) == "paused", 60)
        state = data / "alice" / sid / ".paused" / "pause.json"
        state.write_text(state.read_text().replace('"limits"', '"limits" ', 1))
        r = execute(api, sid, "open('/workspace/kept.txt').read(), 'drawn' in dir()")
        warning = r.headers["x-sandcell-warning"]
        assert "could not be restored" in warning and "HMAC" in warning, warning
        assert "kernel starts fresh" in warning
        assert value(r) == "('kept', False)"  # the files are back; the variables are not
        resumed = [e for e in trace(api, sid) if e["type"] == "sandbox_resumed"]
        assert len(resumed) == 1 and "HMAC" in resumed[0].get("error", "")
        assert not (data / "alice" / sid / ".paused").exists()


def test_a_checkpoint_past_the_users_disk_budget_is_not_kept(model, tmp_path):
    data = tmp_path / "d"
    with idling(model, data, max_user_mb=5) as base, client(base) as api:
        sid = new_session(api)
        started(api, sid)
        wait_for(lambda: sandbox_of(api, sid) == "released", 60)
        assert not (data / "alice" / sid / ".paused").exists()
        r = execute(api, sid, "open('/workspace/kept.txt').read()")
        warning = r.headers["x-sandcell-warning"]
        assert "could not be paused" in warning and "--max-user-mb" in warning, warning
        assert value(r) == "'kept'"
        released = [e for e in trace(api, sid) if e["type"] == "sandbox_released"]
        assert "past your 5 MB" in released[-1]["not_paused"]


@pytest.mark.timeout(400)
def test_sigterm_pauses_and_a_restarted_server_resumes_with_no_replay(tmp_path):
    proc, base = runsc_server(tmp_path, "90")
    try:
        with client(base) as api:
            sid = new_session(api)
            drawn = started(api, sid)
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        _, err = proc.communicate(timeout=120)
        stopping = time.monotonic() - began
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert container_labels(owner_label(proc.pid)) == []
    assert (tmp_path / "d" / "alice" / sid / ".paused" / "pause.json").is_file()

    again, base = runsc_server(tmp_path, "90")
    try:
        with client(base) as api:
            listed = api.get("/api/sessions").json()
            assert [(s["id"], s["sandbox"]) for s in listed] == [(sid, "paused")]
            began = time.monotonic()
            r = execute(api, sid, BACK)
            resuming = time.monotonic() - began
            assert value(r) == f"({drawn}, 12, 'kept', 'scratch')"  # the same draw: no replay
            assert "x-sandcell-warning" not in r.headers
            kinds = [e["type"] for e in trace(api, sid)]
            assert "rebuilt" not in kinds and kinds.count("sandbox_resumed") == 1
            assert sandbox_of(api, sid) == "live"
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=120)
    finally:
        again.kill()
    assert container_labels(owner_label(again.pid)) == []
    print(
        f"stopped (pausing one session) in {stopping:.1f} s; resumed with a cell in {resuming:.1f} s"
    )


def test_a_checkpoint_that_fails_falls_back_and_loses_nothing(model, tmp_path):
    """A cell left a thread in epoll on a loopback listener, which runsc (2022-12) cannot save:
    the idle pause fails for real (it has ended the whole sandbox here), the session is
    released instead, and its next cell gets a fresh kernel with its files back, and why."""
    data = tmp_path / "d"
    with idling(model, data) as base, client(base) as api:
        sid = new_session(api)
        code = (
            "import os, select, socket, threading\n"
            "listener = socket.socket()\nlistener.bind(('127.0.0.1', 0))\nlistener.listen()\n"
            "poller = select.epoll()\npoller.register(listener.fileno(), select.EPOLLIN)\n"
            "threading.Thread(target=poller.poll, daemon=True).start()\n"
            "os.makedirs('/workspace/output', exist_ok=True)\n"
            "open('/workspace/output/kept.txt', 'w').write('kept')"
        )
        assert execute(api, sid, code).json()["error"] is None
        wait_for(lambda: "sandbox_released" in [e["type"] for e in trace(api, sid)][-1:], 90)
        released = [e for e in trace(api, sid) if e["type"] == "sandbox_released"][-1]
        assert "waiters" in released["not_paused"], released
        assert not (data / "alice" / sid / ".paused").exists()
        assert (data / "alice" / sid / "output" / "kept.txt").read_text() == "kept"
        r = execute(api, sid, "open('/workspace/output/kept.txt').read(), 'listener' in dir()")
        warning = r.headers["x-sandcell-warning"]
        assert "could not be paused" in warning and "kernel starts fresh" in warning, warning
        assert value(r) == "('kept', False)"


@pytest.mark.timeout(400)
def test_a_pause_past_stop_grace_is_cut_short_and_the_restart_replays(tmp_path):
    """--stop-grace bounds the pauses: one still going then has its container removed, the
    server exits with nothing left running, and the restarted one replays the session (a
    half-written checkpoint would be refused by its HMAC) and says so."""
    # 1 s: time for the stopping thread to begin the pause (a 0.2 s bound could pass before
    # it ran, under load: then no pause begins and none is cut), far less than a pause takes
    proc, base = runsc_server(tmp_path, "1")
    try:
        with client(base) as api:
            sid = new_session(api)
            started(api, sid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "was not paused within 1 s (--stop-grace)" in err
    assert container_labels(owner_label(proc.pid)) == []

    again, base = runsc_server(tmp_path, "90")
    try:
        with client(base) as api:
            r = execute(api, sid, "len(df), open('/workspace/kept.txt').read()")
            assert value(r) == "(12, 'kept')"
            assert "rebuilt by re-running its 1 recorded cell(s)" in r.headers["x-sandcell-warning"]
        again.send_signal(signal.SIGTERM)
        again.communicate(timeout=120)
    finally:
        again.kill()
    assert container_labels(owner_label(again.pid)) == []
