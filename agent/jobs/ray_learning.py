"""Recipe learning on a Ray cluster: one agent run per layout across every node.

The driver keeps what a local batch keeps: the library (`OUT/recipes/`) and the layout
learning (`LayoutLearning`). Before it sends a job, it reads the job's layout and decides:
- its layout is being learned now: the job waits on the driver (no task, no node slot);
- no recipe to try at all: the job claims the layout's agent run before it goes (or waits);
- else it goes with its recipes (their text; the newest at that moment).
On the node, a job asks the driver, through the batch's `Desk`, what a local job asks its
`LayoutLearning`: as it starts (parked? the recipes learnt since it was sent?) and, when its
recipes all failed, before any agent run (the claim). Told to wait, it returns holding no
slot and the driver sends it again when the learning run ends. When a job comes back
answered by the agent with its checks passed, the driver makes the recipe from the trace in
the folder that came back, as a local batch does."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray

from sandcell.agent.jobs.batch import NODE_FAILURES, Job, Running, learn_recipe
from sandcell.agent.jobs.fingerprint import Layout
from sandcell.agent.jobs.layout_learning import LayoutLearning
from sandcell.agent.jobs.recipe_library import FOLDER, Entry, Library
from sandcell.agent.jobs.recipe_runner import RECIPE
from sandcell.sandbox import Inputs

ASK_POLL_S = 1.0  # how often a node job waiting for the driver's answer looks for a stop


@dataclass(frozen=True)
class Carried:
    """What a job of a learning batch takes to its node: its layout as the driver read it,
    and the recipes to try (their text)."""

    layout: Layout
    recipes: Library


@dataclass(frozen=True)
class Starting:
    """A job starts on a node: may it go on, and with which recipes?"""

    job_id: str
    key: str
    recipes: tuple[str, ...]  # the names of those it carries


@dataclass(frozen=True)
class Start:
    parked: bool  # its layout is being learned by another job now: it waits
    learned: int
    recipes: Library | None  # the layout's candidates when they are not those carried, or None


@dataclass(frozen=True)
class Claim:
    """A node job's recipes all failed: may it run the agent (and learn its layout)?"""

    job_id: str
    key: str
    learned_before: int


class Desk:
    """Where node jobs ask the driver (an async actor beside the driver): a question waits
    here until the driver's loop takes it (`questions`) and answers it (`answer`)."""

    def __init__(self) -> None:
        self._questions: asyncio.Queue[tuple[int, Starting | Claim]] = asyncio.Queue()
        self._answers: dict[int, asyncio.Future[Any]] = {}
        self._numbers = itertools.count()

    async def ask(self, question: Starting | Claim) -> Any:
        number = next(self._numbers)
        self._answers[number] = asyncio.get_running_loop().create_future()
        await self._questions.put((number, question))
        try:
            return await self._answers[number]
        finally:
            self._answers.pop(number, None)

    async def questions(self) -> list[tuple[int, Starting | Claim]]:
        """The questions waiting (at least one: it waits for the first)."""
        taken = [await self._questions.get()]
        while not self._questions.empty():
            taken.append(self._questions.get_nowait())
        return taken

    async def answer(self, number: int, reply: Any) -> None:
        future = self._answers.get(number)
        if future is not None and not future.done():  # its asker may have gone (a stop)
            future.set_result(reply)


def ask(desk: Any, question: Starting | Claim, running: Running) -> Any:
    """The driver's answer; None when the node stops first (Ctrl-C or SIGTERM)."""
    asked = desk.ask.remote(question)
    while not ray.wait([asked], timeout=ASK_POLL_S)[0]:
        if running.stopping:
            return None
    return ray.get(asked)


class AskDriver:
    """A node job's `batch.Learning`: the claim goes to the driver's `LayoutLearning`. The
    start's question is asked before run_job (run_here: a parked job makes no sandbox)."""

    def __init__(self, desk: Any, running: Running, learned: int):
        self.desk, self.running, self._learned = desk, running, learned
        self._parked = False

    def park_if_learning(self, key: str, job: Any) -> bool:
        return False  # asked as the job started on the node (Starting)

    def learned(self, key: str) -> int:
        return self._learned

    def claim(self, key: str, job: Any, learned_before: int) -> bool:
        granted = ask(self.desk, Claim(job.id, key, learned_before), self.running)
        self._parked = not granted  # a stop (None) parks it too: nothing is recorded
        return bool(granted)

    def is_parked(self, job: Any) -> bool:
        return self._parked


def for_node(entries: list[Entry]) -> Library:
    """The recipes a job takes to its node: named as OUT/<id>/ sees them (a solved job's
    answer links `../recipes/<name>`, as a local job's does), learning nothing there."""
    return Library(
        Path("..", FOLDER), [replace(e, path=Path("..", FOLDER, e.name)) for e in entries],
        learning=False,
    )  # fmt: skip


class ClusterLearning:
    """The driver's side: the library, the layouts, the layout learning, the answers."""

    def __init__(self, library: Library, requeue: Callable[[list[Any]], None]):
        self.library = library
        self.learning = LayoutLearning(requeue)
        self._layouts: dict[str, Layout] = {}
        self._jobs: dict[str, Job] = {}
        self._starts: Counter[str] = Counter()  # per job: starts on a node since it was sent

    def layout(self, job: Job) -> Layout:
        if job.id not in self._layouts:  # read once, by the driver (256 KiB of each input)
            self._layouts[job.id] = Layout.of([item.path for item in Inputs.from_paths(job.inputs)])
        return self._layouts[job.id]

    def place(self, job: Job) -> Carried | None:
        """Before the job is sent: what it carries, or None when it waits on the driver for
        its layout's learning run (its first job with no recipe to try claims that run)."""
        layout = self.layout(job)
        self._jobs[job.id] = job
        if self.learning.park_if_learning(layout.key, job):
            self.learning.settled(job)  # no task holds it
            return None
        candidates = self.library.candidates(layout)
        learned = self.learning.learned(layout.key)
        if not candidates and not self.learning.claim(layout.key, job, learned):
            self.learning.settled(job)
            return None
        self._starts[job.id] = 0
        return Carried(layout, for_node(candidates))

    def answer(self, question: Starting | Claim) -> Start | bool:
        job = self._jobs[question.job_id]
        if isinstance(question, Claim):
            return self.learning.claim(question.key, job, question.learned_before)
        self._starts[job.id] += 1
        self.learning.restarted(job)  # after a lost node: an earlier try's waiting is void
        if self.learning.park_if_learning(question.key, job):
            return Start(True, 0, None)
        learned = self.learning.learned(question.key)
        candidates = self.library.candidates(self.layout(job))  # learnt since, for any layout
        if tuple(e.name for e in candidates) == question.recipes:
            return Start(False, learned, None)
        return Start(False, learned, for_node(candidates))

    def parked(self, job: Job) -> None:
        """The job came back parked from its node: it goes again when it may."""
        self.learning.settled(job)

    def ended(self, job: Job, record: dict[str, Any], folder: Path) -> None:
        """The job's record, its folder written: the recipe learnt from it (the record says
        so), the jobs that waited for it let go. Before the record is written."""
        failures = record.pop(NODE_FAILURES, None) or {}
        if self._starts[job.id] > 1:  # Ray ran it again: its worker or node was lost
            record["warnings"] = [*record.get("warnings", []), (
                f"its Ray worker or node was lost mid-job: it ran {self._starts[job.id]} "
                "times, the last one recorded"
            )]  # fmt: skip
        layout = self.layout(job)
        if record.get("solved_by") == RECIPE:  # tried first among its layout's from now on
            for entry in self.library.entries:
                if entry.name == record.get("recipe"):
                    self.library.solved(entry)
        learn_recipe(self.library, folder, layout, record, failures)
        # a job that claimed its layout before it went may find a recipe learnt meanwhile
        # (for a close layout) that solves it: its layout has a recipe, as if learnt
        solved = "recipe_learned" in record or record.get("solved_by") == RECIPE
        self.learning.ended(job.id, solved)

    def lost(self, job: Job) -> None:
        """The job did not come back (failed outright): a layout it learnt is free again."""
        self.learning.ended(job.id, False)
