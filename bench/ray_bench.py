"""`--ray` figures, on a Ray cluster started here (ray.cluster_utils, nodes on loopback, each
declaring `sandcell: 1`): the per-job cost of the Ray path against the local batch on the same
machine (1 node, 1 slot against 1 worker), and jobs per minute with 2 nodes against 1.

A job's time is what the driver sees: the gap between one job's results line and the next's,
with one slot busy all along (so Ray's placement, the bytes going out and coming back and
the folder written are all in it), the median over the batch; jobs per minute likewise from
the first results line to the last (the cluster's and pools' start left out). Every job must
answer right."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.batch_bench import check, jobs_for
from bench.tasks import TASKS, batch_script
from sandcell.agent import ScriptedModel
from sandcell.agent.jobs.batch import Batch, Job, JobSettings, ThreadExecutor
from sandcell.agent.jobs.ray_batch import RayExecutor, Settings
from sandcell.agent.model.settings import ModelSettings

NODE = {"num_cpus": 1, "resources": {"sandcell": 1}, "object_store_memory": 100 << 20}


def timed(batch: Batch) -> list[float]:
    """The moment each results line is written."""
    stamps, record = [], batch.record

    def stamped(line: dict) -> None:
        record(line)
        stamps.append(time.perf_counter())

    batch.record = stamped
    return stamps


def measure(make_batch, jobs: list[Job], by_id: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-ray-") as folder:
        output = Path(folder) / "out"
        batch = make_batch(jobs, output)
        stamps = timed(batch)
        started = time.perf_counter()
        records = batch.run()
        seconds = time.perf_counter() - started
        check(records, by_id, output)
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]  # the first job: startup
    return {"jobs": len(jobs), "seconds": seconds, "job_s": statistics.median(gaps),
            # steady state: from the first results line to the last (startup left out)
            "jobs_per_minute": len(gaps) / (stamps[-1] - stamps[0]) * 60,
            "duration_median_s": statistics.median(r["duration_s"] for r in records)}  # fmt: skip


def scripted(jobs: list[Job], by_id: dict, folder: Path) -> list[Job]:
    """The jobs with their scripts on disk: the driver sends a script to the node like this."""
    out = []
    for job in jobs:
        path = folder / f"{job.id}.json"
        path.write_text(json.dumps(batch_script(by_id[job.id])))
        out.append(Job(job.id, job.task, job.inputs, path))
    return out


def local(jobs: list[Job], by_id: dict) -> dict:
    def make(jobs, output):
        scripts = {job.id: batch_script(by_id[job.id]) for job in jobs}
        threads = ThreadExecutor(1, JobSettings(), lambda job: ScriptedModel(scripts[job.id]))
        return Batch(jobs, output, threads, progress=False)

    return measure(make, jobs, by_id)


def on_ray(cluster, jobs: list[Job], by_id: dict) -> dict:
    def make(jobs, output):
        ray_executor = RayExecutor(
            Settings(JobSettings(), ModelSettings()), address=cluster.address
        )
        return Batch(jobs, output, ray_executor, progress=False)

    return measure(make, jobs, by_id)


def run(smoke: bool) -> dict:
    from ray.cluster_utils import Cluster

    jobs, by_id = jobs_for(TASKS[:3] if smoke else TASKS)
    passes = 1 if smoke else 3
    figures: dict[str, list[dict]] = {"local": [], "ray_1": [], "ray_2": []}
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-scripts-") as folder:
        ray_jobs = scripted(jobs, by_id, Path(folder))
        for _ in range(passes):  # local, 1 node, 2 nodes, and again: a drifting load hits each
            figures["local"].append(local(jobs, by_id))
            cluster = Cluster(initialize_head=True, connect=False,
                              head_node_args=dict(NODE, include_dashboard=False))  # fmt: skip
            try:
                figures["ray_1"].append(on_ray(cluster, ray_jobs, by_id))
                cluster.add_node(**NODE)
                cluster.wait_for_nodes(timeout=60)
                figures["ray_2"].append(on_ray(cluster, ray_jobs, by_id))
            finally:
                cluster.shutdown()
    runs = {name: combine(p) for name, p in figures.items()}
    return {"runs": runs, "cpus": os.cpu_count(),
            "overhead": runs["ray_1"]["job_s"] / runs["local"]["job_s"],
            "scaling": runs["ray_2"]["jobs_per_minute"] / runs["ray_1"]["jobs_per_minute"]}  # fmt: skip


def combine(passes: list[dict]) -> dict:
    return {"jobs": passes[0]["jobs"], "seconds": sum(p["seconds"] for p in passes),
            "jobs_per_minute": statistics.median(p["jobs_per_minute"] for p in passes),
            "job_s": statistics.median(p["job_s"] for p in passes),
            "duration_median_s": statistics.median(p["duration_median_s"] for p in passes),
            "passes": passes}  # fmt: skip


def rows(section: dict, row) -> list[str]:
    runs, cpus = section["runs"], section["cpus"]
    jobs = runs["local"]["jobs"]
    return [
        row(f"`batch --ray` per-job time vs local batch, 1 node × 1 slot vs 1 worker (median "
            f"gap between results lines, {jobs} scripted jobs each)",
            f"{section['overhead']:.2f}× ({runs['ray_1']['job_s']:.2f} s vs "
            f"{runs['local']['job_s']:.2f} s)",
            "≤ 1.15×", section["overhead"] <= 1.15),
        row(f"`batch --ray` jobs per minute, 2 nodes × 1 slot vs 1 node × 1 slot, one machine "
            f"of {cpus} CPUs",
            f"{section['scaling']:.2f}× ({runs['ray_2']['jobs_per_minute']:.1f} vs "
            f"{runs['ray_1']['jobs_per_minute']:.1f})",
            "reported", None),
    ]  # fmt: skip
