"""One bounded load run of `sandcell serve` in its own process, loopback only: 4 users and 24
clients at once creating sessions, uploading and running small cells, one client flooding
output and one opening sessions past its user's cap. No answer is a 5xx, no user holds more
sandboxes than its cap and each is served, the server's memory stays bounded, and SIGTERM
afterwards leaves no container."""

import signal
import threading
import time
from collections import Counter

import httpx
import psutil
import pytest

from tests.containers import container_labels, owner_label
from tests.serve_helpers import client, execute, make_users, new_session, serve_process, upload

USERS = make_users(4)
PER_USER = 2  # --max-sessions-per-user; --max-sessions is room for every user's cap
CLIENTS_PER_USER = 6
LOAD_S = 40.0  # the clients stop starting requests then; each request is bounded too
RSS_BOUND_MB = 400  # measured here: 255 MB at the peak (8 sandboxes, the flood included)
FLOOD = (
    "from IPython.display import display\n"
    "for i in range(60): display({'text/plain': 'x' * (1 << 20)}, raw=True)\n"
    "for i in range(200): print('y' * 50_000)\n"
)


class Load:
    """Statuses seen, per user the most sandboxes held and the cells that ran, errors."""

    def __init__(self):
        self.lock = threading.Lock()
        self.statuses: Counter[int] = Counter()
        self.server_errors: list[str] = []
        self.served: Counter[str] = Counter()
        self.most_live: Counter[str] = Counter()
        self.retry_after: list[str] = []
        self.failures: list[str] = []

    def saw(self, what: str, r: httpx.Response) -> httpx.Response:
        with self.lock:
            self.statuses[r.status_code] += 1
            if r.status_code >= 500:
                self.server_errors.append(f"{what}: {r.status_code} {r.text[:300]}")
            if r.status_code == 429:
                self.retry_after.append(r.headers.get("Retry-After", ""))
        return r


def a_session(api: httpx.Client, load: Load, what: str) -> str | None:
    """A new session, or (past the user's cap) one of the user's own."""
    r = load.saw(what, api.post("/api/sessions"))
    if r.status_code == 201:
        return r.json()["id"]
    assert r.status_code == 429, r.text
    mine = load.saw(what, api.get("/api/sessions")).json()
    return mine[0]["id"] if mine else None


def worker(base: str, user: str, n: int, load: Load, end: float) -> None:
    what = f"{user} client {n}"
    try:
        with client(base, USERS[user]) as api:
            sid = None
            while sid is None and time.monotonic() < end:
                sid = a_session(api, load, what)
            i = 0
            while time.monotonic() < end:
                i += 1
                if i % 3 == 1:
                    load.saw(what, upload(api, sid, (f"c{n}-{i}.csv", b"a,b\n1,2\n")))
                r = load.saw(what, execute(api, sid, f"{n} * 1000 + {i}"))
                if r.status_code == 200 and r.json()["results"]:
                    assert r.json()["results"][0]["data"]["text/plain"] == str(n * 1000 + i)
                    with load.lock:
                        load.served[user] += 1
                else:  # 409: another client of this user has the session's turn
                    assert r.status_code in (409, 507), r.text
                    time.sleep(0.2)
    except Exception as error:  # noqa: BLE001 (named in the assertion, with its client)
        load.failures.append(f"{what}: {type(error).__name__}: {error}")


def flooder(base: str, user: str, load: Load, end: float) -> None:
    try:
        with client(base, USERS[user]) as api:
            sid = None
            while sid is None and time.monotonic() < end:
                sid = a_session(api, load, "flooder")
            while time.monotonic() < end:
                r = load.saw("flooder", execute(api, sid, FLOOD))
                if r.status_code == 200:
                    body = r.json()
                    assert len(body["results"]) <= 32, len(body["results"])
                    # a flood cut short by its deadline (a loaded machine) may not reach the cap
                    if body["error"] is None and not body["timed_out"] and not body["restarted"]:
                        assert body["rich_dropped"] > 0, {
                            k: body[k] for k in ("rich_dropped", "duration_s")
                        }
    except Exception as error:  # noqa: BLE001
        load.failures.append(f"flooder: {type(error).__name__}: {error}")


def greedy(base: str, user: str, load: Load, end: float) -> None:
    """Asks for sessions past its user's cap: 429s with Retry-After, never a 5xx."""
    try:
        with client(base, USERS[user]) as api:
            while time.monotonic() < end:
                load.saw("greedy", api.post("/api/sessions"))
                time.sleep(0.5)
    except Exception as error:  # noqa: BLE001
        load.failures.append(f"greedy: {type(error).__name__}: {error}")


def watch(base: str, load: Load, end: float, proc: psutil.Process, rss: list[float]) -> None:
    """Each user's sandboxes held, and the server's memory, every half second."""
    apis = {user: client(base, token) for user, token in USERS.items()}
    try:
        while time.monotonic() < end:
            rss.append(proc.memory_info().rss / (1 << 20))
            for user, api in apis.items():
                listed = api.get("/api/sessions").json()
                live = sum(1 for s in listed if s["sandbox"] == "live")
                with load.lock:
                    load.most_live[user] = max(load.most_live[user], live)
            time.sleep(0.5)
    finally:
        for api in apis.values():
            api.close()


@pytest.mark.docker
@pytest.mark.timeout(240)
@pytest.mark.xdist_group("serve-load")  # 8 sandboxes at once: not beside another load test
def test_four_users_and_24_clients_get_no_5xx_each_within_its_cap_and_sigterm_cleans_up(
    tmp_path,
):
    caps = ["--max-sessions", str(PER_USER * len(USERS)), "--max-sessions-per-user"]
    proc, base = serve_process(
        tmp_path, ["Final Answer: -"], *caps, str(PER_USER), "--pool", "2", "--timeout", "30",
        stderr=None, users=USERS,
    )  # fmt: skip
    load, rss = Load(), []
    try:
        with client(base, USERS["user0"]) as api:  # one session made before the crowd
            new_session(api)
        end = time.monotonic() + LOAD_S
        users = list(USERS)
        threads = [
            threading.Thread(target=worker, args=(base, users[k % 4], k, load, end))
            for k in range(4 * CLIENTS_PER_USER - 2)
        ]
        threads.append(threading.Thread(target=flooder, args=(base, "user1", load, end)))
        threads.append(threading.Thread(target=greedy, args=(base, "user2", load, end)))
        threads.append(
            threading.Thread(target=watch, args=(base, load, end, psutil.Process(proc.pid), rss))
        )
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LOAD_S + 150)
        assert not any(t.is_alive() for t in threads), "a client is still waiting for the server"
        assert load.failures == [], load.failures
        assert load.server_errors == [], load.server_errors
        assert all(load.most_live[u] <= PER_USER for u in USERS), load.most_live
        assert all(load.served[u] > 0 for u in USERS), load.served
        assert load.retry_after and all(s.isdigit() for s in load.retry_after)
        print(f"statuses {dict(load.statuses)}, cells per user {dict(load.served)}, ", end="")
        print(f"server RSS at most {max(rss):.0f} MB")
        assert max(rss) < RSS_BOUND_MB, rss
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 143
    assert container_labels(owner_label(proc.pid)) == []
