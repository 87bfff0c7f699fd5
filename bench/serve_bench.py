"""`sandcell serve` figures: a trivial cell through the HTTP API (`POST .../execute`) against
`DockerSandbox.run` in process, 8 sessions at once, p50 and p95, rounds alternated so the
machine's load falls on both alike; the memory an idle session holds (the server's RSS per
session beside its container); and the time from `POST .../messages` to the first event."""

from __future__ import annotations

import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import docker
import psutil

from bench.sandbox_bench import container_mb, summary
from sandcell.sandbox import DockerSandbox
from tests.containers import owner_label
from tests.serve_helpers import client, events, serve_process

SESSIONS = 8
CELL = "1 + 1"


def _in_process(sandboxes: list[DockerSandbox], runs: int) -> list[float]:
    def one(sandbox: DockerSandbox) -> list[float]:
        took = []
        for _ in range(runs):
            started = time.perf_counter()
            sandbox.run(CELL)
            took.append(time.perf_counter() - started)
        return took

    with ThreadPoolExecutor(len(sandboxes)) as workers:
        return [t for each in workers.map(one, sandboxes) for t in each]


def _through_api(base: str, sids: list[str], runs: int) -> list[float]:
    def one(sid: str) -> list[float]:
        took = []
        with client(base) as api:  # one keep-alive connection per caller, as a client holds
            for _ in range(runs):
                started = time.perf_counter()
                r = api.post(f"/api/sessions/{sid}/execute", json={"code": CELL})
                took.append(time.perf_counter() - started)
                assert r.status_code == 200 and r.json()["error"] is None, r.text
        return took

    with ThreadPoolExecutor(len(sids)) as workers:
        return [t for each in workers.map(one, sids) for t in each]


def _first_event_s(base: str, sid: str) -> float:
    with client(base) as api:
        started = time.perf_counter()
        with api.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "hi"}) as r:
            first = None
            for _ in events(r):
                first = first or time.perf_counter()
    return first - started


@contextmanager
def _server(folder: Path, replies: int) -> Iterator[tuple[str, int]]:
    """`sandcell serve` in its own process, as it is deployed (its clients are not in its
    process); (base URL, pid). SIGTERM at the end removes its containers."""
    proc, base = serve_process(
        folder, ["Final Answer: done"] * replies, "--pool", "0",
        "--max-sessions", str(SESSIONS + 1), stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield base, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(smoke: bool) -> dict:
    rounds, runs, firsts = (2, 10, 3) if smoke else (5, 40, 15)
    with (
        tempfile.TemporaryDirectory() as folder,
        _server(Path(folder), firsts) as (base, pid),
        client(base) as api,
    ):
        server = psutil.Process(pid)
        before = server.memory_info().rss
        sids = [api.post("/api/sessions").json()["id"] for _ in range(SESSIONS)]
        for sid in sids:  # every sandbox up and used once
            assert api.post(f"/api/sessions/{sid}/execute", json={"code": "1"}).status_code == 200
        time.sleep(1)  # let the kernels settle before reading memory
        host_mb = (server.memory_info().rss - before) / 2**20 / SESSIONS
        idle_container_mb = statistics.median(container_mb(c) for c in _containers_of(pid))
        sandboxes = [DockerSandbox() for _ in range(SESSIONS)]
        try:
            for sandbox in sandboxes:
                sandbox.run(CELL)
            api_s, direct_s = [], []
            for _ in range(rounds):
                direct_s += _in_process(sandboxes, runs)
                api_s += _through_api(base, sids, runs)
        finally:
            for sandbox in sandboxes:
                sandbox.close()
        first = [_first_event_s(base, sids[0]) for _ in range(firsts)]
    a, d = summary(api_s), summary(direct_s)
    return {
        "sessions": SESSIONS,
        "api_s": a,
        "in_process_s": d,
        "p50_ratio": a["median"] / d["median"],
        "p95_ratio": a["p95"] / d["p95"],
        "idle_host_mb_per_session": host_mb,
        "idle_container_mb": idle_container_mb,
        "first_event_s": summary(first),
    }


def _containers_of(pid: int) -> list:
    engine = docker.from_env()
    found = engine.api.containers(filters={"label": owner_label(pid)})
    return [engine.containers.get(entry["Id"]) for entry in found]


def rows(section: dict, row) -> list[str]:
    s, ms = section, 1000
    return [
        row(
            f"trivial cell through `POST /execute` vs in-process `DockerSandbox.run`, "
            f"{s['sessions']} sessions at once (p50 / p95 ratio)",
            f"{s['p50_ratio']:.2f}× / {s['p95_ratio']:.2f}× ({s['api_s']['median'] * ms:.1f} ms"
            f" vs {s['in_process_s']['median'] * ms:.1f} ms p50)",
            "≤ 1.5×",
            s["p50_ratio"] <= 1.5 and s["p95_ratio"] <= 1.5,
        ),
        row(
            "memory per idle served session (server RSS / container)",
            f"{s['idle_host_mb_per_session']:.1f} MB / {s['idle_container_mb']:.0f} MB",
            "",
            None,
        ),
        row(
            "`POST /messages` to its first event (median / p95)",
            f"{s['first_event_s']['median'] * ms:.0f} ms / {s['first_event_s']['p95'] * ms:.0f} ms",
            "",
            None,
        ),
    ]
