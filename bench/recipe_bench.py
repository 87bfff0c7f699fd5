"""Recipe figures (issue 25's cost): what a job costs when no model is asked, against an agent
job whose replies come at once, measured in one run with one worker each.

- agent job: agent.batch.Batch on the scripted task set (warm pool, a fresh sandbox per job),
  as bench/batch_bench.py runs it with one worker.
- recipe job: a sandbox from SandboxPool.acquire(inputs) (renewed after the first job), the
  recipe's cells (read a CSV, drop duplicates, write output/clean.csv), the output copied
  back, then SandboxPool.release(sandbox), which renews it for the next job.

CPU-seconds per recipe job: the container's cgroup CPU time (cpuacct, read on the host) plus
this process's own CPU time, over the jobs after the first (the first starts the container),
the first renewal included (the supervisor then imports what its forked kernels share).
Docker's daemons are not counted (no container starts or execs but the export's)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench import batch_bench
from bench.tasks import TASKS
from sandbox import DockerSandbox, SandboxPool

RECIPE = (
    "import pandas as pd",
    "df = pd.read_csv(INPUT)",
    "df = df.drop_duplicates()",
    "df.to_csv('/workspace/output/clean.csv', index=False)",
    "len(df)",
)
CPU_TARGET_S = 0.7
RATIO_TARGET = 3.0


def cgroup_cpu_s(sandbox: DockerSandbox) -> float:
    """The container's CPU time so far (cgroup v1 cpuacct or v2 cpu.stat), read on the host."""
    pid = sandbox.container.attrs["State"]["Pid"]
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            usage = Path(f"/sys/fs/cgroup/cpuacct{path}/cpuacct.usage")
            return int(usage.read_text()) / 1e9
        if controllers == "":
            stat = Path(f"/sys/fs/cgroup{path}/cpu.stat").read_text().split()
            return int(stat[stat.index("usage_usec") + 1]) / 1e6
    raise RuntimeError("no CPU cgroup found for the sandbox container")


def write_input(folder: Path, index: int) -> Path:
    path = folder / f"vendor-{index}.csv"
    rows = [f"{i % 1500},n{i % 1500},{(i % 1500) * 1.5}\n" for i in range(2000 + index)]
    path.write_text("id,name,amount\n" + "".join(rows))
    return path


def recipe_job(pool: SandboxPool, source: Path, out: Path) -> DockerSandbox:
    sandbox = pool.acquire([source])
    for cell in RECIPE:
        ex = sandbox.run(cell.replace("INPUT", repr(f"/data/{source.name}")))
        assert ex.ok, (cell, ex.error)
    assert ex.text == "1500", ex.text
    assert sandbox.export(out, "output") == ["clean.csv"]
    return sandbox


def recipe_jobs(count: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-recipe-") as folder:
        root = Path(folder)
        with SandboxPool(size=1) as pool:
            sandbox = recipe_job(pool, write_input(root, 0), root / "out-0")  # started it
            while pool.ready() < 1:  # the refill it asked for, done before the count begins
                time.sleep(0.05)
            # counted from the first renewal on, which also preloads the kernel's modules
            cpu0, host0, started = cgroup_cpu_s(sandbox), time.process_time(), time.perf_counter()
            assert pool.release(sandbox), pool.renew_error
            for index in range(1, count + 1):
                again = recipe_job(pool, write_input(root, index), root / f"out-{index}")
                assert again is sandbox, "the pool started a new sandbox: renewal failed"
                assert pool.release(again), pool.renew_error
            seconds = time.perf_counter() - started
            cgroup = cgroup_cpu_s(sandbox) - cpu0
            host = time.process_time() - host0
    return {"jobs": count, "seconds": seconds, "jobs_per_minute": count / seconds * 60,
            "cpu_s_per_job": (cgroup + host) / count, "cgroup_cpu_s_per_job": cgroup / count,
            "host_cpu_s_per_job": host / count}  # fmt: skip


def combine(passes: list[dict]) -> dict:
    jobs, seconds = sum(p["jobs"] for p in passes), sum(p["seconds"] for p in passes)
    per_job = {
        key: sum(p[key] * p["jobs"] for p in passes) / jobs
        for key in ("cpu_s_per_job", "cgroup_cpu_s_per_job", "host_cpu_s_per_job")
    }
    return {"jobs": jobs, "seconds": seconds, "jobs_per_minute": jobs / seconds * 60,
            **per_job, "passes": passes}  # fmt: skip


def fresh_recipe_job() -> dict:
    """The same recipe in a sandbox started for it, as a job costs without renewal."""
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-recipe-") as folder:
        source = write_input(Path(folder), 0)
        host0, started = time.process_time(), time.perf_counter()
        with DockerSandbox(inputs=[source]) as sandbox:
            for cell in RECIPE:
                assert sandbox.run(cell.replace("INPUT", repr(f"/data/{source.name}"))).ok
            sandbox.export(Path(folder) / "out", "output")
            cgroup = cgroup_cpu_s(sandbox)
        return {"seconds": time.perf_counter() - started,
                "cpu_s": cgroup + time.process_time() - host0}  # fmt: skip


def run(smoke: bool) -> dict:
    """Agent and recipe passes take turns (agent, recipe, agent, recipe), so a load that
    drifts on this shared machine hits both alike."""
    tasks = TASKS[:4] if smoke else TASKS
    halves = (tasks[: len(tasks) // 2], tasks[len(tasks) // 2 :])
    agents, recipes = [], []
    for half in halves:
        agents.append(batch_bench.throughput(half, 1))
        recipes.append(recipe_jobs(2 if smoke else 12))
    agent, recipe = batch_bench.combine(agents), combine(recipes)
    fresh = [fresh_recipe_job() for _ in range(2 if smoke else 5)]
    return {
        "agent": agent,
        "recipe": recipe,
        "fresh_cpu_s": sorted(f["cpu_s"] for f in fresh)[len(fresh) // 2],
        "ratio": recipe["jobs_per_minute"] / agent["jobs_per_minute"],
    }


def rows(section: dict, row) -> list[str]:
    agent, recipe = section["agent"], section["recipe"]
    return [
        row("recipe jobs per minute (renewed sandbox, recipe cells, output copied back) vs "
            "agent jobs per minute (fresh sandbox, replies at once), 1 worker each",
            f"{section['ratio']:.2f}× ({recipe['jobs_per_minute']:.1f} vs "
            f"{agent['jobs_per_minute']:.1f})",
            f"≥ {RATIO_TARGET:g}×", section["ratio"] >= RATIO_TARGET),
        row("CPU-seconds per recipe job, renewed sandbox (container cgroup + host process; "
            "the same job in a fresh sandbox)",
            f"{recipe['cpu_s_per_job']:.2f} s ({section['fresh_cpu_s']:.2f} s)",
            f"≤ {CPU_TARGET_S:g} s", recipe["cpu_s_per_job"] <= CPU_TARGET_S),
    ]  # fmt: skip
