"""A batch job tried first with recipes (agent.jobs.recipe_library), with no model: each
recipe's cells run in the job's sandbox with the job's own inputs, then the job's checks. One
passed: the job is answered by that recipe. Each attempt starts on a clean slate (the sandbox
renewed: no process, file or variable of the last attempt left), so one recipe's leftovers
never let the next pass or take its credit; the agent too starts on one, told which recipes
were tried and how each failed."""

from __future__ import annotations

import os
import shlex
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.agent import stops
from sandcell.agent.events import Final
from sandcell.agent.jobs.recipe_library import Entry
from sandcell.agent.jobs.recipe_maker import Loaded, parameters_cell
from sandcell.agent.output_checks import outcome_lines
from sandcell.agent.seams import RunResult
from sandcell.agent.session import Session
from sandcell.sandbox.boundary import DATA
from sandcell.sandbox.render import render
from sandcell.sandbox.wheelhouse import resolve

RECIPE, AGENT = "recipe", "agent"  # a results line's "solved_by"
SHOWN_CHARS = 2000  # of a failed cell's observation, in the agent's first message


@dataclass
class Tried:
    """What trying the recipes came to: a result when one solved the job (or a stop cut it
    short), the recipe that did, the recipes tried in order, the last one's failure (for the
    results line), and what the agent is told when none solved it."""

    result: RunResult | None = None
    solved_by: Entry | None = None
    tried: list[str] = field(default_factory=list)
    failures: dict[str, dict] = field(default_factory=dict)  # each failed recipe's, by name
    handover: str = ""

    @property
    def failure(self) -> dict | None:
        """The last failed recipe's failure (the results line's recipe_failure)."""
        return list(self.failures.values())[-1] if self.failures else None


@dataclass
class _Failed:
    entry: Entry
    failure: dict
    how: str


def try_recipes(session: Session, entries: list[Entry]) -> Tried:
    """Each recipe in turn, each on a clean slate, until one solves the job; when none did,
    what the agent is told (the caller gives it a clean slate too, if it runs it)."""
    failed: list[_Failed] = []
    for entry in entries:
        if failed:
            session.start_over()
        result, failure, how = try_recipe(session, entry.recipe, entry.path)
        if result is not None:
            tried = [f.entry.name for f in failed] + [entry.name]
            solved = entry if result.answered else None
            return Tried(result, solved, tried, _failures(failed))
        assert failure is not None  # try_recipe says how it failed whenever it gives no result
        failed.append(_Failed(entry, failure, how))
    return Tried(
        tried=[f.entry.name for f in failed], failures=_failures(failed), handover=_handover(failed)
    )


def _failures(failed: list[_Failed]) -> dict[str, dict]:
    return {f.entry.name: f.failure for f in failed}


def try_recipe(
    session: Session, recipe: Loaded, path: Path
) -> tuple[RunResult | None, dict | None, str]:
    """Run the recipe in the session, then the job's checks (a job without any cannot use a
    recipe: nothing would tell a wrong output): its result when it solved the job (or a stop
    cut it short), else how it failed, for the results line and for the agent."""
    if session.checker is None:
        raise ValueError("a job without declared checks cannot use a recipe")
    started = time.monotonic()
    paths = [f"{DATA}/{name}" for name in session.inputs.names]
    if len(paths) != recipe.inputs:
        why = f"it takes {recipe.inputs} input(s) and this job has {len(paths)}"
        return None, {"cell": None, "error": why}, why
    if recipe.packages:
        failed = _install(session, recipe.packages)
        if failed is not None:
            return None, {"cell": None, "error": "packages"}, failed
    cells = [parameters_cell(paths, recipe.parameters), *recipe.cells]
    stopped = session.run_cells(cells)
    if session.loop.cancelled:  # Ctrl-C or SIGTERM: the job ends here, as interrupted
        stop = RunResult(None, session.loop.cancelled, "interrupted while the recipe ran")
        return session.settle(stop), None, ""
    if stopped is not None:
        index, execution = stopped
        said = render(execution, SHOWN_CHARS)
        error = execution.error.name if execution.error else "stopped"
        where = f"its cell {index} (of {len(recipe.cells)}) failed"
        return None, {"cell": index, "error": error}, f"{where}:\n{said}"
    feedback = session.checker(session.loop.questions)  # publishes the check run
    assert session.checker.last is not None  # the call above set it
    checks = session.checker.last.record()
    if feedback is None:
        link = os.path.relpath(path, session.folder) if path.is_absolute() else str(path)
        answer = (
            f"Solved by the recipe [{path.name}]({link}) with no model: its "
            f"{len(recipe.cells)} cells ran on this job's inputs and the outputs passed their "
            "checks."
        )
        session.publish(  # the trace ends the job as a question's answer would
            Final(question=session.loop.questions, tokens=0, answer=answer,
                  duration_s=round(time.monotonic() - started, 3),
                  stop_reason=stops.ANSWERED, detail="", error=None, steps=0)
        )  # fmt: skip
        return session.settle(RunResult(answer, stops.ANSWERED, checks=checks)), None, ""
    said = "\n".join(outcome_lines(checks["outputs"]))
    return None, {"cell": None, "checks": checks}, f"its outputs failed their checks:\n{said}"


def _install(session: Session, packages: tuple[str, ...]) -> str | None:
    """`%pip install` the packages the recipe's cells installed (from this machine's
    wheelhouse); None when they were, else how it failed, naming this machine (a Ray node)."""
    stopped = session.run_cells([f"%pip install -q {' '.join(map(shlex.quote, packages))}"])
    if stopped is None:
        return None
    said = render(stopped[1], SHOWN_CHARS)
    return (
        f"the packages it needs ({', '.join(packages)}) could not be installed on "
        f"{socket.gethostname()} (its wheelhouse: {resolve(session.agent.limits.wheelhouse) or 'none'}):\n{said}"
    )


def _handover(failed: list[_Failed]) -> str:
    """The agent's first message after the task, when recipes were tried: each one and how it
    failed, the first one's code (the likeliest to be close), and that nothing is left."""
    if not failed:
        return ""
    first = failed[0]
    if len(failed) == 1:
        said = (
            f"A recipe ({first.entry.name}) that cleaned another file of this family was tried "
            f"on this job first, with no model, and {first.how}"
        )
    else:
        said = f"{len(failed)} recipes that cleaned other files were tried on this job first, "
        said += "with no model; none solved it:\n\n" + "\n\n".join(
            f"- {f.entry.name}: {f.how}" for f in failed
        )
    shown = "\n\n".join(f"# %%\n{cell}" for cell in first.entry.recipe.cells)
    return (
        f"{said}\n\nYour kernel is a fresh one and /workspace is empty: nothing of the "
        f"recipes is left (INPUTS is not set). {first.entry.name}, which set INPUTS to this "
        f"job's input paths:\n\n```python\n{shown}\n```\n\nFinish the task; the outputs "
        "must pass their checks."
    )
