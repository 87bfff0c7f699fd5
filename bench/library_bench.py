"""Recipe-library figures (issue 38's targets): a shuffled mixed delivery (five families, two
of them sharing one layout, under names that do not say which), cleaned by `sandcell batch`
with 2 workers and a scripted model server that answers each job as its family needs: by
the agent alone, then with `--recipe auto` (a recipe learnt per layout). Then next month's
delivery of the same families and one never seen, with `--recipe OUT/recipes`. Model
requests per file and jobs per minute (the batch command's wall time); every output must
equal the truth, worked out on the host apart from the model's cells."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from tests.cli_runner import sandcell
from tests.deliveries import FamilyModel, delivery, truth
from tests.scripted_server import ScriptedServer

FAMILIES = "ABCDE"
REQUESTS_TARGET = 0.25  # model requests per file, with the library
SINGLE_RECIPE = 1.27  # `--recipe auto` with one recipe per batch on the same kind of set


def one_batch(
    folder: Path,
    out: str,
    family_of: dict[str, str],
    recipe: str | None,
    where: tuple[str, ...] = ("--workers", "2"),
) -> dict:
    """The delivery in `folder` cleaned into `out`; `where`: 2 workers here, or `--ray ADDR`."""
    model = FamilyModel(family_of)
    more = ["--recipe", recipe] if recipe else []
    with ScriptedServer([model] * (4 * len(family_of) + 10)) as server:
        started = time.monotonic()
        done = sandcell(
            "batch", "jobs.jsonl", "--output", out, *where, "--no-progress", *more,
            "--base-url", server.url, "--api-key", "k", "--model", "m", "--protocol", "tools",
            cwd=folder, timeout=3600,
        )  # fmt: skip
        seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for line in (folder / out / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        name = f"{record['id']}.csv"
        got = pd.read_csv(folder / out / record["id"] / "output" / "clean.csv")
        pd.testing.assert_frame_equal(got, truth(folder / name, family_of[name]), check_dtype=False)
    files = len(family_of)
    return {
        "files": files,
        "seconds": round(seconds, 1),
        "jobs_per_minute": files / seconds * 60,
        "requests": sum(model.asked.values()),
        "requests_per_file": sum(model.asked.values()) / files,
        "requests_by_family": dict(sorted(model.asked.items())),
    }


def run(smoke: bool) -> dict:
    per_family = 2 if smoke else 12
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-library-") as name:
        first = Path(name) / "first"
        first.mkdir()
        family_of = delivery(first, dict.fromkeys(FAMILIES, per_family))
        agent = one_batch(first, "agent", family_of, None)
        library = one_batch(first, "out", family_of, "auto")
        learnt = sorted(p.name for p in (first / "out" / "recipes").iterdir())
        later = Path(name) / "later"
        later.mkdir()
        counts = dict.fromkeys(FAMILIES, 1 if smoke else 3) | {"F": 2}
        family_of = delivery(later, counts, start=500)
        reused = one_batch(later, "out", family_of, str(first / "out" / "recipes"))
    return {
        "agent": agent,
        "library": library,
        "recipes_learnt": learnt,
        "later": reused,
        "ratio": library["jobs_per_minute"] / agent["jobs_per_minute"],
    }


def rows(section: dict, row) -> list[str]:
    agent, library, later = section["agent"], section["library"], section["later"]
    by_family = ", ".join(f"{k} {v}" for k, v in library["requests_by_family"].items())
    known = sum(v for k, v in later["requests_by_family"].items() if k != "F")
    new = later["requests_by_family"].get("F", 0)
    return [
        row(f"mixed delivery ({library['files']} files of {len(FAMILIES)} families, shuffled, 2 "
            "workers): model requests per file, recipe library vs the agent alone (one recipe "
            f"per batch, measured before: {SINGLE_RECIPE})",
            f"{library['requests_per_file']:.2f} vs {agent['requests_per_file']:.2f} "
            f"({by_family}; {len(section['recipes_learnt'])} recipes learnt)",
            f"≤ {REQUESTS_TARGET:g}", library["requests_per_file"] <= REQUESTS_TARGET),
        row("the same delivery: jobs per minute, recipe library vs the agent alone (replies at "
            "once; the batch command's wall time)",
            f"{section['ratio']:.2f}× ({library['jobs_per_minute']:.1f} vs "
            f"{agent['jobs_per_minute']:.1f})", "", None),
        row(f"next delivery with --recipe OUT/recipes ({later['files']} files, one family never "
            "seen): model requests for known layouts / for the new one",
            f"{known} / {new} ({later['jobs_per_minute']:.1f} jobs per minute)",
            "0 / 2 (one agent run)", known == 0 and new == 2),
    ]  # fmt: skip
