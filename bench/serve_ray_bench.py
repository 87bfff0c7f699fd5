"""`sandcell serve --ray` figures (issue 49's targets), on a Ray cluster started here
(ray.cluster_utils, nodes on loopback sharing this machine's engine):
- a trivial cell through `POST .../execute`, 8 sessions at once, served with `--ray` (two nodes
  of 4 slots) against the same server without it, rounds alternated so the machine's load falls
  on both alike: p50 and p95;
- under gVisor, a paused sandbox restored on another node (its own node removed after the
  pause) against one restored on the node it was paused on, through `RayPool` itself (the
  pause's bytes to the server and out again both ways)."""

from __future__ import annotations

import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.sandbox_bench import summary
from bench.serve_bench import CELL, SESSIONS, _through_api
from sandcell.sandbox import Inputs, Limits
from tests.serve_helpers import client, serve_process

NODE = {"num_cpus": 1, "resources": {"sandcell": 4}, "object_store_memory": 100 << 20}
HEAD = {"num_cpus": 1, "object_store_memory": 100 << 20, "include_dashboard": False}


@contextmanager
def _server(folder: Path, *options: str) -> Iterator[str]:
    folder.mkdir(parents=True)
    proc, base = serve_process(
        folder, ["Final Answer: done"], "--pool", "0", "--max-sessions", str(SESSIONS + 1),
        *options, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def _sessions(folder: Path, *options: str) -> Iterator[tuple[str, list[str]]]:
    with _server(folder, *options) as base, client(base) as api:
        sids = [api.post("/api/sessions").json()["id"] for _ in range(SESSIONS)]
        for sid in sids:  # every sandbox up and used once
            assert api.post(f"/api/sessions/{sid}/execute", json={"code": CELL}).status_code == 200
        yield base, sids


def _resume_s(pool, node_of_pause: str | None, cluster, folder: Path) -> tuple[float, bool]:
    """Pause a sandbox (on the node RayPool chooses) into `folder`; with `node_of_pause` None
    restore it where it was, else remove that node first. Seconds of the restore, and whether
    it landed on another node."""
    sandbox = pool.acquire()
    sandbox.run("x = 41")
    paused_on = sandbox.node
    sandbox.pause(folder)
    if node_of_pause is not None:
        (node,) = [n for n in cluster.worker_nodes if n.node_id == paused_on]
        cluster.remove_node(node, allow_graceful=False)
        pool.forget(paused_on)
    started = time.perf_counter()
    resumed = pool.resume(folder, Inputs())
    seconds = time.perf_counter() - started
    try:
        assert resumed.run("x + 1").text == "42"
        return seconds, resumed.node != paused_on
    finally:
        resumed.close()


def run(smoke: bool) -> dict:
    from ray.cluster_utils import Cluster

    from sandcell.sandbox.cluster import RayPool

    rounds, runs, resumes = (1, 5, 1) if smoke else (3, 20, 3)
    local_s: list[float] = []
    ray_s: list[float] = []
    same_s: list[float] = []
    other_s: list[float] = []
    cluster = Cluster(initialize_head=True, connect=False, head_node_args=HEAD)
    try:
        for _ in range(2):
            cluster.add_node(**NODE)
        cluster.wait_for_nodes(timeout=60)
        with tempfile.TemporaryDirectory() as folder:
            for number in range(rounds):  # alternated: a drifting load falls on both
                with _sessions(Path(folder) / f"local-{number}") as (base, sids):
                    local_s += _through_api(base, sids, runs)
                with _sessions(Path(folder) / f"ray-{number}", "--ray", cluster.address) as (
                    base,
                    sids,
                ):
                    ray_s += _through_api(base, sids, runs)
            pool = RayPool(cluster.address, 0, Limits(runtime="runsc"))
            try:
                for number in range(resumes):
                    seconds, moved = _resume_s(pool, None, cluster, Path(folder) / f"s{number}")
                    assert not moved
                    same_s.append(seconds)
                    seconds, moved = _resume_s(pool, "any", cluster, Path(folder) / f"o{number}")
                    assert moved
                    other_s.append(seconds)
                    cluster.add_node(**NODE)  # for the next round, and the server's next use
                    cluster.wait_for_nodes(timeout=60)
            finally:
                pool.close()
    finally:
        cluster.shutdown()
    local, on_ray = summary(local_s), summary(ray_s)
    return {
        "sessions": SESSIONS,
        "local_s": local,
        "ray_s": on_ray,
        "p50_ratio": on_ray["median"] / local["median"],
        "p95_ratio": on_ray["p95"] / local["p95"],
        "resume_same_s": same_s,
        "resume_other_s": other_s,
        "resume_ratio": statistics.median(other_s) / statistics.median(same_s),
    }


def rows(section: dict, row) -> list[str]:
    s, ms = section, 1000
    same, other = statistics.median(s["resume_same_s"]), statistics.median(s["resume_other_s"])
    return [
        row(f"trivial cell through `POST /execute`, {s['sessions']} sessions at once: `serve "
            "--ray` (2 nodes) vs the local serve (p50 / p95 ratio)",
            f"{s['p50_ratio']:.2f}× / {s['p95_ratio']:.2f}× ({s['ray_s']['median'] * ms:.1f} ms "
            f"vs {s['local_s']['median'] * ms:.1f} ms p50)",
            "≤ 1.5× p50", s["p50_ratio"] <= 1.5),
        row("`serve --ray` under gVisor: a paused sandbox restored on another node vs on its own "
            "(RayPool.resume, the pause's bytes out of the server and onto the node)",
            f"{s['resume_ratio']:.2f}× ({other:.2f} s vs {same:.2f} s)",
            "≤ 1.3×", s["resume_ratio"] <= 1.3),
    ]  # fmt: skip
