"""`sandcell serve` under more than one user at once: nothing blocks the event loop (a slow
container start freezes nobody else), the operator's cell timeout holds for /execute, and
each user has a cap on sessions holding a sandbox and a budget of disk."""

import threading
import time

import pytest

from sandbox import Limits
from tests.scripted_server import ScriptedServer
from tests.serve_helpers import (
    ask,
    client,
    config,
    execute,
    new_session,
    serving,
    upload,
)

SLOW_START_S = 8  # the rebuild of a resumed session re-runs a cell that sleeps this long


@pytest.fixture
def model():
    with ScriptedServer() as server:
        yield server


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_health_answers_within_1s_while_a_container_starts_and_an_upload_waits_on_it(
    model, tmp_path
):
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
        assert took < 1.0, f"/api/health took {took:.2f} s while a container started"
        assert not waiting and time.monotonic() - began < SLOW_START_S, "the start was over"
        for thread in threads:
            thread.join(120)
        assert waiting == {"upload": 201, "message": "then"}


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_execute_may_ask_for_less_than_the_servers_cell_timeout_never_more(model, tmp_path):
    with (
        serving(config(model, tmp_path / "d", limits=Limits(timeout_s=5))) as base,
        client(base) as api,
    ):
        field = api.get("/openapi.json").json()["components"]["schemas"]["Code"]
        assert "--timeout" in field["properties"]["timeout"]["description"]
        sid = new_session(api)
        for asked in (5.5, 24 * 3600):
            r = execute(api, sid, "1", timeout=asked)
            assert r.status_code == 422, r.text
            assert "cell timeout of 5 s (sandcell serve --timeout)" in r.json()["error"]
        began = time.monotonic()
        r = execute(api, sid, "while True: pass", timeout=1)
        assert r.status_code == 200 and r.json()["timed_out"], r.text
        assert time.monotonic() - began < 5
        r = execute(api, sid, "import time\ntime.sleep(30)")  # none asked: the server's 5 s
        assert r.json()["timed_out"] and r.json()["duration_s"] < 15, r.text
