"""`sandcell serve` under more than one user at once: nothing blocks the event loop (a slow
container start freezes nobody else), the operator's cell timeout holds for /execute, and
each user has a cap on sessions holding a sandbox and a budget of disk."""

import threading
import time

import pytest

from sandcell.sandbox import Limits
from tests.scripted_server import ScriptedServer
from tests.serve_helpers import (
    BOB,
    ask,
    client,
    config,
    execute,
    new_session,
    python,
    serving,
    upload,
    wait_for,
)

SLOW_START_S = 12  # the rebuild of a resumed session re-runs a cell that sleeps this long


@pytest.fixture
def model():
    with ScriptedServer() as server:
        yield server


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_health_answers_at_once_while_a_container_starts_and_an_upload_waits_on_it(model, tmp_path):
    """A resumed session's start re-runs its recorded cells: one that sleeps makes a start
    that takes SLOW_START_S. An upload to that session waits for the start holding the
    sandbox's lock; a message sent then waits for the same lock in `renew`. Only the message's
    own request may wait: /api/health (and every other user) must not."""
    data = tmp_path / "d"
    with serving(config(model, data)) as base, client(base) as api:
        sid = new_session(api)
        r = execute(api, sid, f"import time\ntime.sleep({SLOW_START_S})")
        assert r.json()["error"] is None, r.text

    with serving(config(model, data)) as base, client(base) as api:
        model.add("Final Answer: begun")  # no code: the start goes on after the answer
        assert ask(api, sid, "Begin")[-1][1]["answer"] == "begun"
        assert api.get(f"/api/sessions/{sid}").json()["sandbox"] == "live"
        began = time.monotonic()
        waiting: dict[str, object] = {}

        def send_upload() -> None:
            with client(base) as other:
                waiting["upload"] = upload(other, sid, ("late.csv", b"a\n1\n")).status_code

        def send_message() -> None:
            with client(base) as other:
                waiting["message"] = ask(other, sid, "Then?")[-1][1]["answer"]

        model.add("Final Answer: then")
        threads = [threading.Thread(target=send_upload), threading.Thread(target=send_message)]
        threads[0].start()
        time.sleep(0.5)  # the upload holds the sandbox's lock, waiting for the start
        threads[1].start()
        time.sleep(0.5)  # the message waits for that lock in renew
        assert not waiting, f"the start ended before health was asked: {waiting}"
        with client(base, token=None) as anon:
            asked = time.monotonic()
            assert anon.get("/api/health", timeout=30).status_code == 200
            took = time.monotonic() - asked
        # blocked, it would wait out the start (about 10 s more); a loaded machine may take 1 s
        assert took < 4.0, f"/api/health took {took:.2f} s while a container started"
        assert not waiting and time.monotonic() - began < SLOW_START_S, "the start was over"
        for thread in threads:
            thread.join(120)
        assert waiting == {"upload": 201, "message": "then"}


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_execute_may_ask_for_less_than_the_servers_cell_timeout_never_more(model, tmp_path):
    with (
        serving(config(model, tmp_path / "d", limits=Limits(timeout_s=10))) as base,
        client(base) as api,
    ):
        field = api.get("/openapi.json").json()["components"]["schemas"]["Code"]
        assert "--timeout" in field["properties"]["timeout"]["description"]
        sid = new_session(api)
        for asked in (10.5, 24 * 3600):
            r = execute(api, sid, "1", timeout=asked)
            assert r.status_code == 422, r.text
            assert "cell timeout of 10 s (sandcell serve --timeout)" in r.json()["error"]
        r = execute(api, sid, "while True: pass", timeout=1)
        assert r.status_code == 200 and r.json()["timed_out"], r.text
        assert r.json()["duration_s"] < 6, r.text  # its own 1 s, not the server's 10
        r = execute(api, sid, "import time\ntime.sleep(30)")  # none asked: the server's 10 s
        assert r.json()["timed_out"] and r.json()["duration_s"] < 25, r.text


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_a_user_past_their_sessions_gets_429_with_retry_after_while_another_is_served(
    model, tmp_path
):
    cfg = config(model, tmp_path / "d", max_sessions=4, max_sessions_per_user=2, idle_minutes=10)
    with serving(cfg) as base, client(base) as alice, client(base, BOB) as bob:
        first, _ = new_session(alice), new_session(alice)
        r = alice.post("/api/sessions")
        assert r.status_code == 429, r.text
        assert "(2, --max-sessions-per-user)" in r.json()["error"]
        assert 590 <= int(r.headers["retry-after"]) <= 631  # when her first goes idle
        assert bob.post("/api/sessions").status_code == 201  # the server has room for him
        assert alice.delete(f"/api/sessions/{first}").status_code == 204
        assert alice.post("/api/sessions").status_code == 201


def chunked(*parts: bytes):
    """A body sent without Content-Length (chunked): the server learns its size as it reads."""
    yield from parts


def inputs_on_disk(data, sid: str) -> list[str]:
    return sorted(p.name for p in (data / "alice" / sid / "inputs").iterdir())


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_users_disk_budget_counts_uploads_and_session_folders_507_past_it(model, tmp_path):
    data, mb = tmp_path / "d", 1 << 20
    with (
        serving(config(model, data, max_user_mb=2)) as base,
        client(base) as api,
        client(base, BOB) as bob,
    ):
        sid = new_session(api)
        # declared (Content-Length): refused before anything is written
        r = upload(api, sid, ("a.csv", b"x" * mb), ("b.csv", b"y" * (mb + mb // 2)))
        assert r.status_code == 507, r.text
        assert "of your 2 MB (--max-user-mb" in r.json()["error"]
        assert "DELETE /api/sessions/{id}" in r.json()["error"]
        # sent chunked: counted as it is written, and nothing of it stays
        head = b'--b\r\nContent-Disposition: form-data; name="file"; filename="c.csv"\r\n\r\n'
        r = api.post(
            f"/api/sessions/{sid}/files",
            content=chunked(head, *[b"z" * (mb // 4)] * 10, b"\r\n--b--\r\n"),
            headers={"content-type": "multipart/form-data; boundary=b"},
        )
        assert r.status_code == 507 and "refused at c.csv" in r.json()["error"], r.text
        assert inputs_on_disk(data, sid) == []
        assert api.get(f"/api/sessions/{sid}").json()["inputs"] == []

        # what the code makes counts too: a file linked 8 times comes back as one file
        model.add(
            python(
                "import os\nos.makedirs('/workspace/output', exist_ok=True)\n"
                "open('/workspace/output/a.bin', 'wb').write(os.urandom(600_000))\n"
                "for i in range(8): os.link('/workspace/output/a.bin', f'/workspace/output/l{i}.bin')"
            ),
            "Final Answer: made",
        )
        made = ask(api, sid, "Make a file")[-1][1]
        assert made["answer"] == "made" and not made["warnings"], made
        a = data / "alice" / sid / "output" / "a.bin"
        assert a.stat().st_size == 600_000 and a.stat().st_nlink == 9
        r = upload(api, sid, ("big.csv", b"x" * (mb + mb // 2)))  # fits 2 MB alone, not now
        assert r.status_code == 507 and "--max-user-mb" in r.json()["error"], r.text
        assert upload(api, sid, ("small.csv", b"a\n1\n")).status_code == 201

        # a collect past the budget: a warning of the answer, the files not copied
        model.add(
            python("open('/workspace/output/b.bin', 'wb').write(os.urandom(1_600_000))"),
            "Final Answer: more",
        )
        more = ask(api, sid, "Make more")[-1][1]
        assert more["answer"] == "more", more
        assert any("--max-user-mb" in w for w in more["warnings"]), more["warnings"]
        assert not (data / "alice" / sid / "output" / "b.bin").exists()
        assert not list((data / "alice" / sid).glob(".collect-*"))

        # past the budget (a trace grew; the operator lowered it): no question or cell starts
        (data / "alice" / sid / "workspace").mkdir(exist_ok=True)
        (data / "alice" / sid / "workspace" / "grown.bin").write_bytes(b"g" * (mb + mb // 2))
        r = execute(api, sid, "1")
        assert r.status_code == 507 and "no question or cell starts" in r.json()["error"]
        r = api.post(f"/api/sessions/{sid}/messages", json={"content": "Again?"})
        assert r.status_code == 507, r.text
        assert execute(bob, new_session(bob), "1").status_code == 200  # bob's disk is his own
        assert api.delete(f"/api/sessions/{sid}").status_code == 204
        assert execute(api, new_session(api), "1").status_code == 200  # room again


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_a_released_session_of_a_user_at_their_cap_is_not_renewed_429(model, tmp_path):
    cfg = config(model, tmp_path / "d", max_sessions=4, max_sessions_per_user=1, idle_minutes=0.1)
    with serving(cfg) as base, client(base) as api:
        first = new_session(api)
        assert execute(api, first, "x = 1").status_code == 200
        wait_for(lambda: api.get(f"/api/sessions/{first}").json()["sandbox"] == "released", 60)
        second = new_session(api)  # her one sandbox now
        r = execute(api, first, "1")
        assert r.status_code == 429 and "--max-sessions-per-user" in r.json()["error"], r.text
        assert int(r.headers["retry-after"]) >= 1
        assert execute(api, second, "2").status_code == 200
