"""A batch job tried first with a recipe (agent.jobs.recipe_maker): its cells run in the job's sandbox
with the job's own inputs and no model, then the job's checks. Passed: the job is answered
by the recipe. A cell failed or a check did: the agent takes over in the same session (the
kernel as the recipe left it), its first message holding the recipe and how it failed."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from agent import stops
from agent.events import Final
from agent.jobs.recipe_maker import Loaded, RecipeError, from_run, load, parameters_cell
from agent.output_checks import outcome_lines
from agent.seams import RunResult
from agent.session import Session
from sandbox.boundary import DATA
from sandbox.render import render

log = logging.getLogger(__name__)
RECIPE, AGENT = "recipe", "agent"  # a results line's "solved_by"
SHOWN_CHARS = 2000  # of a failed cell's observation, in the agent's first message


@dataclass
class Tried:
    """What trying the recipe came to: a result when it solved the job, else how it failed
    (for the results line) and what the agent is told."""

    result: RunResult | None = None
    failure: dict | None = None
    handover: str = ""


def try_recipe(session: Session, recipe: Loaded, path: Path) -> Tried:
    """Run the recipe in the session, then the job's checks (a job without any cannot use a
    recipe: nothing would tell a wrong output)."""
    if session.checker is None:
        raise ValueError("a job without declared checks cannot use a recipe")
    started = time.monotonic()
    paths = [f"{DATA}/{name}" for name in session.inputs.names]
    if len(paths) != recipe.inputs:
        why = f"the recipe takes {recipe.inputs} input(s) and this job has {len(paths)}"
        return _handover(recipe, path, {"cell": None, "error": why}, why, ran=False)
    cells = [parameters_cell(paths, recipe.parameters), *recipe.cells]
    stopped = session.run_cells(cells)
    if session.loop.cancelled:  # Ctrl-C or SIGTERM: the job ends here, as interrupted
        stop = RunResult(None, session.loop.cancelled, "interrupted while the recipe ran")
        return Tried(session.settle(stop))
    if stopped is not None:
        index, execution = stopped
        said = render(execution, SHOWN_CHARS)
        error = execution.error.name if execution.error else "stopped"
        where = f"its cell {index} (of {len(recipe.cells)}) failed"
        failure = {"cell": index, "error": error}
        kept = execution.restarted is None  # a restart emptied the kernel
        return _handover(recipe, path, failure, f"{where}:\n{said}", ran=kept)
    feedback = session.checker(session.loop.questions)  # publishes the check run
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
        return Tried(session.settle(RunResult(answer, stops.ANSWERED, checks=checks)))
    said = "\n".join(outcome_lines(checks["outputs"]))
    return _handover(
        recipe, path, {"cell": None, "checks": checks}, f"its outputs failed their checks:\n{said}"
    )


class AutoRecipe:
    """`--recipe auto`: no recipe until a job the agent answered passes its checks; then that
    job's, kept as DIR/recipe.py, for every job that starts after it (a rerun starts with the
    one kept). Jobs already running with the agent finish that way."""

    def __init__(self, output: Path):
        self.path = output / "recipe.py"
        self._lock = threading.Lock()
        self.loaded: Loaded | None = None
        if self.path.is_file():
            try:
                self.loaded = load(self.path)
            except RecipeError:
                pass  # not a recipe (edited by hand?): learnt again, and rewritten

    def settings(self, settings):
        """The batch's job settings, with the recipe once there is one."""
        with self._lock:
            loaded = self.loaded
        if loaded is None:
            return settings
        return replace(settings, recipe=loaded, recipe_path=str(self.path))

    def learn(self, record: dict, folder: Path) -> None:
        checks = record.get("checks") or {}
        if record.get("status") != "answered" or not checks.get("passed"):
            return
        if record.get("solved_by") == RECIPE:
            return  # a recipe's own job: the recipe is known already
        with self._lock:
            if self.loaded is not None:
                return
            try:
                script = from_run(folder).script()
                temporary = self.path.with_suffix(".tmp")
                temporary.write_text(script, encoding="utf-8")
                temporary.replace(self.path)
                self.loaded = load(self.path)
            except (RecipeError, OSError) as error:  # nothing to learn from this job
                log.warning("no recipe learnt from %s: %s", folder.name, error)


def _handover(recipe: Loaded, path: Path, failure: dict, how: str, ran: bool = True) -> Tried:
    shown = "\n\n".join(f"# %%\n{cell}" for cell in recipe.cells)
    state = (
        "The recipe's cells ran in your kernel up to that point, with INPUTS set to this "
        "job's inputs; its variables are there."
        if ran
        else "Nothing of it is in your kernel."
    )
    text = (
        f"A recipe ({path.name}) that cleaned another file of this family was tried on this "
        f"job first, and {how}\n\n{state} The recipe:\n\n"
        f"```python\n{shown}\n```\n\nFinish the task; the outputs must pass their checks."
    )
    return Tried(None, failure, text)
