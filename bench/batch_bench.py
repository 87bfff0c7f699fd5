"""Batch figures: jobs per minute with 1, 2 and 4 workers on the scripted task set, through
agent.jobs.batch.Batch itself (warm sandbox pool, one Docker sandbox per job, a ScriptedModel per
job). Every job must answer, and its trace must show the sandbox computed the right value.

Twice: with replies that come at once (the jobs are then all sandbox work, bounded by how fast
this machine starts containers), and with each reply 1 s late, as an endpoint's are (the
workers then overlap the waits, which is what they are for)."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.tasks import TASKS, Task, answer_text, batch_script, result_in
from sandcell.agent import ScriptedModel
from sandcell.agent.jobs.batch import Batch, Job, JobSettings, ThreadExecutor

MODEL_WAIT_S = 1.0  # the late replies' wait, before each one


class LateModel:
    """A ScriptedModel whose every reply comes MODEL_WAIT_S late, as an endpoint's does."""

    def __init__(self, model: ScriptedModel, wait_s: float):
        self.model, self.name, self.wait_s = model, model.name, wait_s

    def complete(self, messages: list[dict], tools: list[dict] | None = None, **kw: object):
        time.sleep(self.wait_s)
        return self.model.complete(messages, tools, **kw)


def jobs_for(tasks: list[Task]) -> tuple[list[Job], dict[str, Task]]:
    jobs, by_id = [], {}
    for task in tasks:
        job_id = f"{task.id}-0"
        jobs.append(Job(job_id, task.prompt(f"/data/{task.csv.name}"), [task.csv]))
        by_id[job_id] = task
    return jobs, by_id


def check(records: list[dict], by_id: dict[str, Task], output: Path) -> None:
    """Each job answered, and the value the sandbox printed is the host's truth."""
    for record in records:
        expected = by_id[record["id"]].expected()  # reads the CSV: once per job
        assert record["status"] == "answered", record
        assert record["answer"] == expected, record
        observations = [
            o["text"]
            for line in (output / record["id"] / "trace.jsonl").read_text().splitlines()
            for o in json.loads(line).get("observations") or []
        ]
        assert expected == answer_text(result_in(observations[-1])), record["id"]


def throughput(tasks: list[Task], workers: int, wait_s: float = 0.0) -> dict:
    jobs, by_id = jobs_for(tasks)
    scripts = {job.id: batch_script(by_id[job.id]) for job in jobs}

    def model(job: Job):
        scripted = ScriptedModel(scripts[job.id])
        return LateModel(scripted, wait_s) if wait_s else scripted

    with tempfile.TemporaryDirectory(prefix="sandcell-bench-batch-") as folder:
        output = Path(folder)
        batch = Batch(jobs, output, ThreadExecutor(workers, JobSettings(), model), progress=False)
        started = time.perf_counter()
        records = batch.run()
        seconds = time.perf_counter() - started
        check(records, by_id, output)
    durations = sorted(r["duration_s"] for r in records)
    return {"workers": workers, "jobs": len(jobs), "seconds": seconds,
            "jobs_per_minute": len(jobs) / seconds * 60,
            "job_median_s": durations[len(durations) // 2]}  # fmt: skip


def combine(passes: list[dict]) -> dict:
    jobs, seconds = sum(p["jobs"] for p in passes), sum(p["seconds"] for p in passes)
    return {"workers": passes[0]["workers"], "jobs": jobs, "seconds": seconds,
            "jobs_per_minute": jobs / seconds * 60, "passes": passes,
            "job_median_s": statistics.median(p["job_median_s"] for p in passes)}  # fmt: skip


def run(smoke: bool) -> dict:
    """Each worker count runs the task set; in a full run the order goes 1, 2, 4, 4, 2, 1 so a
    load that drifts on this shared machine hits every count alike. Then 1 and the most
    workers again with late replies."""
    tasks = TASKS[:3] if smoke else TASKS
    counts = (1, 2) if smoke else (1, 2, 4)
    section = compare(tasks, counts, smoke, 0.0)
    section["late"] = compare(tasks, (1, counts[-1]), smoke, MODEL_WAIT_S) | {
        "wait_s": MODEL_WAIT_S
    }
    return section


def compare(tasks: list[Task], counts: tuple[int, ...], smoke: bool, wait_s: float) -> dict:
    order = counts if smoke else counts + counts[::-1]
    passes: dict[int, list[dict]] = {n: [] for n in counts}
    for n in order:
        passes[n].append(throughput(tasks, n, wait_s))
    runs = {str(n): combine(p) for n, p in passes.items()}
    most = str(max(counts))
    return {"runs": runs, "ratio": runs[most]["jobs_per_minute"] / runs["1"]["jobs_per_minute"],
            "ratio_workers": int(most)}  # fmt: skip


def rows(section: dict, row) -> list[str]:
    runs, n = section["runs"], section["ratio_workers"]
    jobs = next(iter(runs.values()))["jobs"]
    per_minute = " / ".join(f"{r['jobs_per_minute']:.1f}" for r in runs.values())
    medians = " / ".join(f"{r['job_median_s']:.1f} s" for r in runs.values())
    target, met = ("≥ 3×", section["ratio"] >= 3) if n == 4 else ("≥ 3× at 4 workers", None)
    return [
        row(f"batch jobs per minute, {' / '.join(runs)} workers ({jobs} scripted jobs each; "
            "median job time)",
            f"{per_minute} ({medians})",
            "", None),
        row(f"batch throughput, {n} workers vs 1 (replies at once: bounded by container starts "
            "on this machine)", f"{section['ratio']:.2f}×", target, met),
        *late_rows(section.get("late"), row),
    ]  # fmt: skip


def late_rows(late: dict | None, row) -> list[str]:
    if not late:
        return []
    one, most = late["runs"]["1"], late["runs"][str(late["ratio_workers"])]
    return [
        row(f"batch throughput, {late['ratio_workers']} workers vs 1, each reply {late['wait_s']:g} s "
            "late as an endpoint's (jobs per minute)",
            f"{late['ratio']:.2f}× ({most['jobs_per_minute']:.1f} vs {one['jobs_per_minute']:.1f})",
            "reported", None),
    ]  # fmt: skip
