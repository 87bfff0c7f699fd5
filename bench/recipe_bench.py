"""Recipe figures (issue 25's cost): the same cleaning jobs, each with its declared checks,
run through agent.jobs.batch.Batch with one worker, twice in one run: by the agent (a scripted
model whose replies come at once: a fresh sandbox per job from the warm pool) and by a recipe
(`--recipe FILE`: no model; each job's sandbox renewed in the background and reused).

CPU-seconds are the whole machine's (/proc/stat: user, nice, system, irq, softirq), so the
Docker daemons, the runtime's `exec`s, the containers and this process are all counted, and
so is other load on this shared machine: the rate it spent in the 3 s before each pass, while
this process slept, is kept beside the figures (not taken off: under a load that comes and
goes, as in the test suite, that would make nonsense). Per job, the figures are taken over
the steady part of a batch, from the end of its STARTUP_JOBS-th job to its last (the pool's
first containers and their first renewals come before); the whole batch's, start-up
included, are beside them. Each job's cell prints its container's name: a recipe pass must
have reused its containers."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pandera.pandas as pa

from sandcell.agent import ScriptedModel
from sandcell.agent.events import Step
from sandcell.agent.jobs.batch import Batch, Job, JobSettings, ThreadExecutor
from sandcell.agent.jobs.recipe_library import Library
from sandcell.agent.output_checks import load_expect
from sandcell.agent.records.trace import read_events

CPU_TARGET_S = 0.7
RATIO_TARGET = 3.0
STARTUP_JOBS = 3
HOST_MARK = "container "
CLEAN = (
    "import pandas as pd, socket\n"
    "df = pd.read_csv('/data/{name}').drop_duplicates()\n"
    "df = df[df.amount >= 0]\n"
    "df.to_csv('/workspace/output/clean.csv', index=False)\n"
    f"print({HOST_MARK!r}, socket.gethostname())\n"
)
SCHEMA = pa.DataFrameSchema(
    {"id": pa.Column(int, unique=True), "amount": pa.Column(float, pa.Check.ge(0))},
    strict=True,
    coerce=True,
)


def machine_cpu_s() -> float:
    """CPU-seconds this machine has spent, all cores: user, nice, system, irq and softirq
    (not idle, iowait, nor the time a hypervisor stole)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def background_cpu_rate(seconds: float = 3.0) -> float:
    """CPU-seconds a second the machine spends while this process waits: the other load."""
    cpu0 = machine_cpu_s()
    time.sleep(seconds)
    return (machine_cpu_s() - cpu0) / seconds


def family(folder: Path, count: int) -> list[Job]:
    """`count` vendor exports (duplicated rows, 2,000 or so each) with one schema."""
    (folder / "clean.yaml").write_text(SCHEMA.to_yaml())
    expect = load_expect({"output/clean.csv": "clean.yaml"}, folder)
    jobs = []
    for i in range(count):
        rows = [f"{k % 1500},{(k % 1500) * 1.5}\n" for k in range(2000 + i)]
        (folder / f"vendor-{i}.csv").write_text("id,amount\n" + "".join(rows))
        jobs.append(
            Job(f"v{i}", f"Clean vendor-{i}.csv", [folder / f"vendor-{i}.csv"], expect=expect)
        )
    recipe = CLEAN.format(name="vendor-0.csv").replace("'/data/vendor-0.csv'", "INPUTS[0]")
    (folder / "recipe.py").write_text(
        f"# %% tags=[\"parameters\"]\nINPUTS = ['/data/vendor-0.csv']\n\n# %%\n{recipe}"
    )
    return jobs


def one_batch(jobs: list[Job], output: Path, settings: JobSettings, solver: str) -> dict:
    """The batch, with the machine's CPU time and the clock read as each job ends."""
    models: list[ScriptedModel] = []

    def model(job: Job) -> ScriptedModel:  # each job's: its cell, then its answer
        code = CLEAN.format(name=Path(str(job.inputs[0])).name)
        cell = {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}
        models.append(ScriptedModel([cell, "Final Answer: cleaned."]))
        return models[-1]

    batch = Batch(jobs, output, ThreadExecutor(1, settings, model), progress=False)
    marks, record = [], batch.record

    def marked(line: dict) -> None:
        record(line)
        marks.append((machine_cpu_s(), time.perf_counter()))

    batch.record = marked
    other = background_cpu_rate()
    cpu0, started = machine_cpu_s(), time.perf_counter()
    records = batch.run()
    for line in records:  # every job answered, by the solver meant, its checks passed
        assert line["status"] == "answered" and line["checks"]["passed"], line
        assert line.get("solved_by") == (None if solver == "agent" else "recipe"), line
    (cpu_a, at_a), (cpu_b, at_b) = marks[STARTUP_JOBS - 1], marks[-1]
    seconds = marks[-1][1] - started
    containers = len({container(output / line["id"]) for line in records})
    assert solver == "agent" or containers < len(records) / 2, "no sandbox was renewed"
    return {"jobs": len(records), "model_calls": sum(len(m.requests) for m in models),
            "containers": containers,
            "seconds": seconds, "cpu_s": marks[-1][0] - cpu0,
            "steady_jobs": len(marks) - STARTUP_JOBS, "steady_seconds": at_b - at_a,
            "steady_cpu_s": cpu_b - cpu_a, "background_cpu_rate": other}  # fmt: skip


def container(folder: Path) -> str:
    """The container a job ran in, as its last cell printed it (the host name)."""
    for event in read_events(folder / "trace.jsonl"):
        for ex in event.executions() if isinstance(event, Step) else []:
            for line in ex.stdout.splitlines():
                if line.startswith(HOST_MARK):
                    return line.split()[1]
    raise AssertionError(f"{folder.name}: no cell printed its container")


def combine(passes: list[dict]) -> dict:
    total = {key: sum(p[key] for p in passes) for key in passes[0]}
    return total | {
        "jobs_per_minute": total["steady_jobs"] / total["steady_seconds"] * 60,
        "cpu_s_per_job": total["steady_cpu_s"] / total["steady_jobs"],
        "batch_jobs_per_minute": total["jobs"] / total["seconds"] * 60,
        "batch_cpu_s_per_job": total["cpu_s"] / total["jobs"],
        "background_cpu_rate": max(p["background_cpu_rate"] for p in passes),
        "passes": passes,
    }


def run(smoke: bool) -> dict:
    """Agent and recipe passes take turns (agent, recipe, agent, recipe), so a load that
    drifts on this shared machine hits both alike."""
    count = 6 if smoke else 20
    agents, recipes = [], []
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-recipe-") as name:
        folder = Path(name)
        jobs = family(folder, count)
        with_recipe = JobSettings(recipes=Library.single(folder / "recipe.py"))
        for turn in range(1 if smoke else 2):
            agents.append(one_batch(jobs, folder / f"agent-{turn}", JobSettings(), "agent"))
            recipes.append(one_batch(jobs, folder / f"recipe-{turn}", with_recipe, "recipe"))
    agent, recipe = combine(agents), combine(recipes)
    return {
        "agent": agent,
        "recipe": recipe,
        "ratio": recipe["jobs_per_minute"] / agent["jobs_per_minute"],
        "batch_ratio": recipe["batch_jobs_per_minute"] / agent["batch_jobs_per_minute"],
        "model_calls_per_job": {
            "agent": agent["model_calls"] / agent["jobs"],
            "recipe": recipe["model_calls"] / recipe["jobs"],
        },
    }


def rows(section: dict, row) -> list[str]:
    agent, recipe = section["agent"], section["recipe"]
    jobs, calls = recipe["jobs"] // len(recipe["passes"]), section["model_calls_per_job"]
    return [
        row("recipe jobs per minute vs agent jobs per minute (replies at once), the same jobs "
            "and checks, 1 worker, after each batch's first jobs",
            f"{section['ratio']:.2f}× ({recipe['jobs_per_minute']:.1f} vs "
            f"{agent['jobs_per_minute']:.1f})",
            f"≥ {RATIO_TARGET:g}×", section["ratio"] >= RATIO_TARGET),
        row("CPU-seconds per recipe job, the whole machine, after each batch's first jobs "
            f"(an agent job's; other load before the passes: up to "
            f"{max(recipe['background_cpu_rate'], agent['background_cpu_rate']):.2f} CPU-s a "
            "second)",
            f"{recipe['cpu_s_per_job']:.2f} s ({agent['cpu_s_per_job']:.2f} s)",
            f"≤ {CPU_TARGET_S:g} s", recipe["cpu_s_per_job"] <= CPU_TARGET_S),
        row(f"a whole batch of {jobs} jobs, start-up included (not the pool's teardown): jobs "
            f"per minute and CPU-seconds per job, recipe vs agent (model calls per job: "
            f"{calls['recipe']:g} vs {calls['agent']:g}; containers: "
            f"{recipe['containers'] // len(recipe['passes'])} vs "
            f"{agent['containers'] // len(agent['passes'])})",
            f"{section['batch_ratio']:.2f}× ({recipe['batch_jobs_per_minute']:.1f} vs "
            f"{agent['batch_jobs_per_minute']:.1f}); {recipe['batch_cpu_s_per_job']:.2f} s vs "
            f"{agent['batch_cpu_s_per_job']:.2f} s", "", None),
    ]  # fmt: skip
