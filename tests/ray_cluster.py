"""A Ray cluster's processes on this machine, for the `--ray` tests: which processes the
cluster ran (the sandboxes they start carry their pids as owners), which are Ray's, which run
a job now."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
from ray import cluster_utils

from sandcell.sandbox.container import owner
from tests.containers import container_labels


class Processes:
    """Every process under this test process while the cluster runs (raylets, Ray workers,
    the driver): the sandboxes they start carry their pids as owners."""

    def __init__(self):
        self.seen: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._done.wait(0.2):
            try:
                self.seen.update(p.pid for p in psutil.Process().children(recursive=True))
            except psutil.Error:
                pass

    def stop(self):
        self._done.set()
        self._thread.join()


def ray_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "ray" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


def owned_by(pids) -> list[dict]:
    owners = {owner(pid) for pid in pids}
    return [
        labels for labels in container_labels("sandcell") if labels.get("sandcell.owner") in owners
    ]


def job_task_workers(raylet_pid: int) -> list[psutil.Process]:
    """Ray workers under one raylet that are running a job (Ray titles them ray::job_task)."""
    busy = []
    for p in psutil.Process(raylet_pid).children(recursive=True):
        try:
            if "job_task" in " ".join(p.cmdline()):
                busy.append(p)
        except psutil.Error:
            pass
    return busy


# a removed node is noticed in seconds, not the default half a minute
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@contextmanager
def ray_cluster(head: dict, nodes: list[dict]) -> Iterator[cluster_utils.Cluster]:
    """A cluster on this machine (a head with `head`'s arguments and a node per `nodes`),
    shut down at the end: no Ray process and no sandbox of its processes may be left."""
    head = {"include_dashboard": False, "_system_config": FAST_HEALTH_CHECKS, **head}
    cluster = cluster_utils.Cluster(initialize_head=True, connect=False, head_node_args=head)
    processes = Processes()
    try:
        for node in nodes:
            cluster.add_node(**node)
        cluster.wait_for_nodes(timeout=60)
        cluster.processes = processes
        yield cluster
    finally:
        cluster.shutdown()
        processes.stop()
        deadline = time.monotonic() + 30
        while ray_processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ray_processes() == [], "Ray processes left after the cluster was shut down"
        assert owned_by(processes.seen) == [], "sandbox containers left by the cluster"
