"""A kernel kept across a pause (gVisor's checkpoints, issue 40): pause and resume seconds and
the checkpoint's size for an idle pandas kernel and for one holding about 200 MB; and, for a
session whose cells took about 10 s, resuming its paused kernel against rebuilding it by
re-running its cells in a fresh sandbox (what a restarted server does without a pause). All
in this run, under runsc. Skipped, with the reason, where the engine cannot checkpoint; the
smoke run does the idle kernel alone."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench import gvisor_bench, skipped_without
from sandcell.agent.records.replay import Cell, rerun
from sandcell.sandbox import DockerSandbox, Limits, checkpoint
from sandcell.sandbox import container as ctr
from sandcell.sandbox.pool import WARMUP

LIMITS = Limits(timeout_s=120, memory_mb=1024, runtime="runsc")
BIG = "import numpy as np\nbig = np.random.default_rng(1).random(25_000_000)  # 200 MB"
SLOW = [  # about 10 s of cells, each leaving state behind
    "import time, pandas as pd, numpy as np",
    "time.sleep(4)\nframe = pd.DataFrame({'a': np.arange(100_000)})",
    "time.sleep(3)\ntotal = int(frame.a.sum())",
    "time.sleep(3)\nhalf = total // 2",
]


def missing() -> str | None:
    """Why this engine cannot checkpoint: the gVisor rows' reason, or no experimental."""
    reason = gvisor_bench.missing()
    if reason is None and not ctr.engine().info().get("ExperimentalBuild"):
        return 'the engine has no "experimental": true (its checkpoints need it)'
    return reason


def paused_and_resumed(cells: list[str], folder: Path) -> dict:
    """Run the cells, pause, resume, check a value is back: the seconds and bytes."""
    with DockerSandbox(LIMITS) as sandbox:
        for code in cells:
            ex = sandbox.run(code)
            if ex.error is not None:
                raise RuntimeError(f"a bench cell failed: {ex.error.name}: {ex.error.value}")
        started = time.perf_counter()
        sandbox.pause(folder)
        pause_s = time.perf_counter() - started
    size = checkpoint.size(folder)
    started = time.perf_counter()
    with DockerSandbox(LIMITS, resume_from=folder) as sandbox:
        ex = sandbox.run("1 + 1")
        resume_s = time.perf_counter() - started
        if ex.error is not None:
            raise RuntimeError("the resumed kernel did not answer")
    return {"pause_s": pause_s, "resume_s": resume_s, "mb": size / (1 << 20)}


def replayed(cells: list[str]) -> float:
    """Seconds to a fresh sandbox brought where the cells left it, by running them again."""
    recorded = [Cell(question=1, step=i, code=code, recorded="") for i, code in enumerate(cells)]
    started = time.perf_counter()
    with DockerSandbox(LIMITS) as sandbox:
        rerun(sandbox, recorded, rebuild=True)
        return time.perf_counter() - started


@skipped_without(missing, "the pause rows are skipped")
def run(smoke: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-pause-") as temp:
        out = {"idle": paused_and_resumed([WARMUP], Path(temp) / "idle")}
        if smoke:
            return out
        out["big"] = paused_and_resumed([WARMUP, BIG], Path(temp) / "big")
        slow = paused_and_resumed(SLOW, Path(temp) / "slow")
    replay_s = replayed(SLOW)
    out["slow"] = {"resume_s": slow["resume_s"], "replay_s": replay_s}
    out["ratio"] = replay_s / slow["resume_s"]
    return out


def rows(r: dict, row) -> list[str]:
    if "skipped" in r:
        return [row("pause and resume (gVisor)", f"skipped: {r['skipped'][:120]}", "", None)]
    found = []
    for key, what in (("idle", "an idle pandas kernel"), ("big", "a kernel holding 200 MB")):
        if key in r:
            one = r[key]
            found.append(
                row(
                    f"pause / resume of {what}: seconds, and the checkpoint's size",
                    f"{one['pause_s']:.1f} s / {one['resume_s']:.1f} s, {one['mb']:.0f} MB",
                    "",
                    None,
                )
            )
    if "slow" in r:
        slow = r["slow"]
        found.append(
            row(
                "a session whose cells took 10 s back: resume vs replay in a fresh sandbox",
                f"{slow['resume_s']:.1f} s vs {slow['replay_s']:.1f} s: {r['ratio']:.1f}× faster",
                "",
                None,
            )
        )
    return found
