"""Many jobs: `sandcell batch JOBS.jsonl --output DIR --workers N`.

Each job runs in its own sandbox from a warm pool; results land in DIR/<id>/ and one line of
DIR/results.jsonl per job, appended and flushed as each job ends. A rerun skips the ids
already in results.jsonl and redoes the rest, so a batch killed half-way loses nothing.
`run_job` is the one job body; an `Executor` runs the jobs: `ThreadExecutor` here, or
`RayExecutor` (agent/jobs/ray_batch.py) on a Ray cluster, both calling `run_job`."""

import collections
import functools
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from sandcell.agent import stops, telemetry
from sandcell.agent.jobs import batch_report
from sandcell.agent.jobs.fingerprint import Layout
from sandcell.agent.jobs.job_files import write_job_files
from sandcell.agent.jobs.layout_learning import LayoutLearning
from sandcell.agent.jobs.recipe_library import FOLDER, Library
from sandcell.agent.jobs.recipe_maker import RecipeError
from sandcell.agent.jobs.recipe_runner import AGENT, RECIPE, Tried, try_recipes
from sandcell.agent.metrics import Metrics
from sandcell.agent.model.scripted import ScriptedModel, ScriptError
from sandcell.agent.output_checks import Expect, ExpectError, load_expect
from sandcell.agent.records.trace import read_events
from sandcell.agent.seams import Model, RunResult, Terminated
from sandcell.agent.session import Agent, Session
from sandcell.agent.stops import Rules
from sandcell.sandbox import DockerSandbox, InputError, Inputs, Limits, Sandbox, SandboxPool

log = logging.getLogger(__name__)
RESULTS = batch_report.RESULTS  # "results.jsonl"
METRICS = "metrics.prom"  # this run's agent.metrics families, as it ends
STOP_WAIT_S = 60.0  # after Ctrl-C or SIGTERM, how long running jobs get to end
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class JobsError(ValueError):
    """JOBS.jsonl cannot be used; the message names the line and what to fix."""


@dataclass
class Job:
    id: str
    task: str
    inputs: Inputs = field(default_factory=Inputs)
    replay: Path | None = None  # a script of replies for this job (demos and tests)
    expect: Expect = field(default_factory=dict)  # output path -> schema its file must pass


def load_jobs(path: Path, expect: Expect | None = None) -> list[Job]:
    """The jobs of JOBS.jsonl; `expect` (--expect) is for the jobs without their own. Every
    schema is loaded now: one pandera cannot load stops the batch before any job starts."""
    jobs, seen = [], set()
    base = path.parent
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as error:
            raise JobsError(
                f"{where}: not JSON ({error.msg}); each line is one job object"
            ) from None
        if not isinstance(raw, dict) or not isinstance(raw.get("task"), str):
            raise JobsError(f'{where}: a job is {{"id": ..., "task": "...", "inputs": [...]}}')
        job_id = str(raw.get("id", number))
        if not _SAFE_ID.match(job_id):
            raise JobsError(f"{where}: id {job_id!r} must be letters, digits, '.', '_' or '-'")
        if job_id in seen:
            raise JobsError(f"{where}: id {job_id!r} is used twice; ids must be unique")
        seen.add(job_id)
        try:
            inputs = Inputs.from_paths([base / p for p in raw.get("inputs", [])])
        except InputError as error:
            raise JobsError(f"{where}: {error}") from None
        replay = (base / raw["replay"]).resolve() if raw.get("replay") else None
        if replay is not None:
            try:
                ScriptedModel(replay)  # a broken script is found now, not when its job runs
            except ScriptError as error:
                raise JobsError(f"{where}: {error}") from None
        try:
            own = raw.get("expect")
            if own is not None and not isinstance(own, dict):
                raise ExpectError('"expect" maps output paths to schema files')
            checks = load_expect(own, base) if own else dict(expect or {})
        except ExpectError as error:
            raise JobsError(f"{where}: {error}") from None
        jobs.append(Job(job_id, raw["task"], inputs, replay, checks))
    if not jobs:
        raise JobsError(f"{path} holds no jobs")
    return jobs


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


# Jobs whose end says nothing about the job itself run again on a rerun: no sandbox or no
# model (failed, or stopped by an endpoint or sandbox error), or cut short by Ctrl-C/SIGTERM.
# A job whose outputs failed their checks is a failed job, retried too.
RETRIED_STOPS = {stops.MODEL_ERROR, stops.SANDBOX_ERROR, stops.INTERRUPTED, stops.TERMINATED}


def settled(record: dict[str, Any]) -> bool:
    """Whether a recorded job is finished for good (a rerun skips it)."""
    if record.get("status") == "answered":
        return True
    return record.get("status") == "stopped" and record.get("stop_reason") not in RETRIED_STOPS


def finished(output: Path) -> dict[str, dict[str, Any]]:
    """Results already recorded, the last line of an id winning; a torn last line (killed
    mid-write) counts as not done."""
    done: dict[str, dict[str, Any]] = {}
    for line in _lines(output / RESULTS):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        done[record["id"]] = record
    return done


class Running:
    """The sessions running now, so Ctrl-C or SIGTERM can stop them all; once stopping, a
    session made afterwards is cancelled as it registers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self.stopping: str | None = None  # the stop reason once Ctrl-C or SIGTERM came

    @contextmanager
    def tracked(self, session: Session) -> Iterator[None]:
        with self._lock:
            self._sessions.add(session)
            stopping = self.stopping
        if stopping:  # the stop came while this session was being made
            session.cancel(stopping)
        try:
            yield
        finally:
            with self._lock:
                self._sessions.discard(session)

    def stop(self, reason: str, within: float = STOP_WAIT_S) -> None:
        """Start no more jobs; stop the running ones, within `within` seconds for them all."""
        with self._lock:
            self.stopping = reason
            running = list(self._sessions)
        for session in running:
            session.cancel(reason)  # all at once, then each is waited for
        deadline = time.monotonic() + within
        for session in running:
            session.stop(reason, within=max(0.0, deadline - time.monotonic()))


@dataclass(frozen=True)
class JobSettings:
    """What every job of a batch shares: the sandbox's limits, the stop rules, the action
    protocol. The model is not here: each executor makes it where the job runs."""

    limits: Limits = field(default_factory=Limits)
    rules: Rules = field(default_factory=Rules)
    protocol: str = "auto"
    vision: str = "auto"
    recipes: Library | None = None  # tried on each job before the agent (recipe_runner)


class Learning(Protocol):
    """One agent run per layout at a time, as a job sees it: `LayoutLearning` in a local
    batch; on a Ray node, the same questions asked of the driver's (agent.jobs.ray_learning)."""

    def park_if_learning(self, key: str, job: Any) -> bool: ...

    def learned(self, key: str) -> int: ...

    def claim(self, key: str, job: Any, learned_before: int) -> bool: ...

    def is_parked(self, job: Any) -> bool: ...


@dataclass
class Attempt:
    """What one job needs beside its session: how it is tried and where it may wait."""

    settings: JobSettings
    pool: SandboxPool | None
    learning: Learning | None
    layout: Layout | None
    learned_before: int = 0


PARKED = None  # run_job's result for a job parked until its layout's learning run ends
# On a Ray node, each failed recipe's failure goes back to the driver (which learns) in the
# record under this key; the driver takes it out before the record is written.
NODE_FAILURES = "_recipe_failures"


def run_job(
    job: Job,
    folder: Path,
    settings: JobSettings,
    *,
    model: Callable[[Job], Model],
    pool: SandboxPool | None,
    running: Running,
    learning: Learning | None = None,
    layout: Layout | None = None,
    trace_parent: str | None = None,
) -> dict[str, Any] | None:
    """Run one job into `folder` (made afresh) and return its line of results.jsonl, or
    PARKED when the job waits for another's agent run to learn its layout (nothing is
    recorded, its sandbox is given back, `learning` requeues it). The one job body: the local
    batch calls it in a thread, a Ray node in its actor. The sandbox comes from `pool`; None
    starts one. `layout`: the inputs' layout when the caller read it already (a Ray driver);
    `trace_parent`: the driver's span of the job (agent.telemetry.begin_job)."""
    paths = [item.path for item in Inputs.from_paths(job.inputs)]  # Inputs, or a list of paths
    if layout is None and settings.recipes is not None:
        layout = Layout.of(paths)
    learned = 0
    if learning is not None:
        assert layout is not None  # a batch learns layouts only with recipes
        if learning.park_if_learning(layout.key, job):
            return PARKED
        learned = learning.learned(layout.key)
    attempt = Attempt(settings, pool, learning, layout, learned)
    fresh_folder(folder)  # an unfinished earlier attempt's is removed
    started = time.monotonic()
    record: dict[str, Any] = {"id": job.id, "task": job.task}
    acquire = functools.partial(pool.acquire, inputs=job.inputs) if pool else None
    solved = PARKED
    try:
        agent = Agent(
            model(job),
            limits=settings.limits,
            rules=settings.rules,
            protocol=settings.protocol,
            vision=settings.vision,
        )
        # taken beside the job's first model request; the session closes it
        session = agent.session(job.inputs, folder, acquire, job.expect, trace_parent)
        with session, running.tracked(session):
            solved = _solve(job, session, attempt)
        if solved is PARKED:
            return PARKED
        result, tried = solved
        write_job_files(result, job.inputs, folder)
        record.update(_results_line(result, folder, tried, layout))
        if tried is not None:
            _learn(attempt, folder, tried, record)
    except Exception as error:  # one job's failure is recorded, never stops the batch
        if solved is PARKED and learning is not None and learning.is_parked(job):
            log.warning("job %s, parked, did not close cleanly: %s", job.id, error)
            return PARKED  # it runs again once requeued: one results line, not two
        record = failed(job, f"{type(error).__name__}: {error}")
    record["duration_s"] = round(time.monotonic() - started, 2)
    return record


def _learn(attempt: Attempt, folder: Path, tried: Tried, record: dict[str, Any]) -> None:
    """A recipe from the job's run, when it was the agent's and passed; on a Ray node, what
    the driver needs to learn it (ray_learning)."""
    recipes, layout = attempt.settings.recipes, attempt.layout
    assert recipes is not None and layout is not None  # tried only with recipes
    if recipes.learning:
        learn_recipe(recipes, folder, layout, record, tried.failures)
    elif attempt.learning is not None:  # a Ray node's job: its driver learns
        record[NODE_FAILURES] = tried.failures


def _give_back(pool: SandboxPool, sandbox: Sandbox) -> None:
    """A session's hand_back in a batch: its sandbox is the pool's (acquired for the job)."""
    assert isinstance(sandbox, DockerSandbox), sandbox
    pool.release(sandbox)


def _solve(job: Job, session: Session, attempt: Attempt) -> tuple[RunResult, Tried | None] | None:
    """The recipes first, with no model, then the agent; PARKED when another job's agent
    run learns this layout now (or learnt it since this job chose its recipes)."""
    recipes, pool, learning = attempt.settings.recipes, attempt.pool, attempt.learning
    if recipes is None:  # the agent alone (a batch learns layouts only with recipes)
        return session.ask(job.task), None
    assert attempt.layout is not None  # run_job knows the layout whenever there are recipes
    tried = try_recipes(session, recipes.candidates(attempt.layout))
    if tried.result is not None:
        if tried.solved_by is not None:
            recipes.solved(tried.solved_by)
        if pool is not None and tried.result.answered:  # no model ran: renewed, reused
            session.hand_back = functools.partial(_give_back, pool)
        return tried.result, tried
    if learning is not None and not learning.claim(attempt.layout.key, job, attempt.learned_before):
        if pool is not None:  # only recipes ran: renewed, reused
            session.hand_back = functools.partial(_give_back, pool)
        return PARKED
    if tried.tried:
        session.start_over()  # the agent on a clean slate too
    handover = tried.handover
    return session.ask(f"{job.task}\n\n{handover}" if handover else job.task), tried


def _results_line(
    result: RunResult, folder: Path, tried: Tried | None, layout: Layout | None
) -> dict[str, Any]:
    """What results.jsonl says of a job that ran (its id, task and duration aside)."""
    line: dict[str, Any] = {
        "status": _status(result),
        "stop_reason": result.stop_reason,
        "answer": result.answer,
        "error": result.error
        or (result.detail if result.stop_reason == stops.CHECKS_FAILED else None),
        "detail": result.detail,
        "steps": result.steps,
        "files": [os.path.relpath(f, folder) for f in result.files],
        "tokens": result.usage.total,
        "warnings": result.warnings,
    }
    if result.checks is not None:
        line["checks"] = result.checks
    if layout is not None:
        line["layout"] = layout.key
    if tried is not None and result.answered:
        line["solved_by"] = RECIPE if tried.solved_by is not None else AGENT
        line["recipe"] = tried.solved_by.name if tried.solved_by is not None else None
        line["recipes_tried"] = tried.tried
    if tried is not None and tried.failure is not None:
        line["recipe_failure"] = tried.failure
    return line


def learn_recipe(
    library: Library,
    folder: Path,
    layout: Layout,
    record: dict[str, Any],
    failures: dict[str, dict[str, Any]],
) -> None:
    """A recipe from a passed agent run (the job's folder and results line; `failures`: how
    each recipe tried failed), added to the library: the results line says which, and, when
    its layout had recipes already and they failed, that the layout drifted. A folder it
    cannot make a recipe from (no trace, no cell that ran) learns nothing, said as a warning."""
    if record.get("solved_by") != AGENT or not (record.get("checks") or {}).get("passed"):
        return
    own = [name for name in record.get("recipes_tried", []) if name in library.names_of(layout)]
    try:
        entry = library.learn(folder, layout)
    except (RecipeError, OSError) as error:  # nothing to learn from this job
        record["warnings"] = [*record["warnings"], f"no recipe learnt from this job: {error}"]
        return
    record["recipe_learned"] = f"{FOLDER}/{entry.name}"
    if own:  # the layout was known, and its recipes failed this job
        failure = failures.get(own[0]) or {}
        how = "failed its checks" if "checks" in failure else _failed_how(failure)
        record["drift"] = f"new recipe for a known layout: {own[0]} {how} on job {record['id']}"


def _failed_how(failure: dict[str, Any]) -> str:
    if failure.get("cell") is not None:
        return f"failed in its cell {failure['cell']} ({failure.get('error')})"
    return f"failed ({failure.get('error')})"


def _status(result: RunResult) -> str:
    if result.answered:
        return "answered"
    if result.stop_reason in (stops.INTERRUPTED, stops.TERMINATED):
        return "interrupted"
    # outputs that never passed their checks: a failed job (a rerun retries it)
    return "failed" if result.stop_reason == stops.CHECKS_FAILED else "stopped"


def failed(job: Job, error: str) -> dict[str, Any]:
    """The results line of a job that failed outright (its error said)."""
    return {"id": job.id, "task": job.task, "status": "failed", "stop_reason": "error",
            "error": error, "duration_s": 0.0}  # fmt: skip


def fresh_folder(folder: Path) -> None:
    """DIR/<id>/ made empty: what an earlier, unfinished attempt left is removed."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)


class Executor(Protocol):
    """Where a batch's jobs run: threads on this host (`ThreadExecutor`) or a Ray cluster
    (`agent.jobs.ray_batch.RayExecutor`). Entered before the progress bar shows, so a backend that
    cannot run (no cluster) says so first; left at the end, whatever happened."""

    def __enter__(self) -> "Executor": ...

    def __exit__(self, *exc: object) -> None: ...

    def run(self, jobs: list[Job], batch: "Batch") -> list[dict[str, Any]]:
        """Run `jobs`, each into batch.output/<id>/; call batch.started() as one starts and
        batch.record(record) as one ends; return the records. On Ctrl-C or SIGTERM
        (KeyboardInterrupt): stop the running jobs, record them as they end, start no more,
        re-raise."""
        ...


class JobQueue:
    """The jobs a batch's threads take, one at a time; a job parked while its layout is being
    learned comes back to the front. take() gives None once every job has ended (or a stop
    came), so a thread waits while parked jobs may yet come back."""

    def __init__(self, jobs: list[Job]):
        self._ready = collections.deque(jobs)
        self._open = len(jobs)  # jobs not ended yet: queued, running or parked
        self._changed = threading.Condition()
        self.stopped = False

    def take(self) -> Job | None:
        with self._changed:
            while not self._ready and self._open and not self.stopped:
                self._changed.wait()
            return None if self.stopped or not self._ready else self._ready.popleft()

    def requeue(self, jobs: list[Job]) -> None:
        with self._changed:
            self._ready.extendleft(reversed(jobs))
            self._changed.notify_all()

    def ended(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify_all()

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()


class ThreadExecutor:
    """The jobs in threads on this host, `workers` at once, each in a sandbox from one warm
    pool; `model` gives each job its model. With a library that learns (--recipe auto or
    DIR), a passed agent run adds its recipe, and one agent run at a time learns a layout."""

    def __init__(self, workers: int, settings: JobSettings, model: Callable[[Job], Model]):
        self.workers, self.settings, self.model = workers, settings, model
        self._parked: set[str] = set()  # ids of the jobs waiting for a learning run
        self._spans = telemetry.JobSpans()

    def __enter__(self) -> "ThreadExecutor":
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # run() removes its pool and threads itself

    def run(self, jobs: list[Job], batch: "Batch") -> list[dict[str, Any]]:
        running, queue = Running(), JobQueue(jobs)
        recipes = self.settings.recipes
        learning = LayoutLearning(queue.requeue) if recipes and recipes.learning else None
        # One more than the workers: the next job's sandbox is ready when a job ends. With
        # recipes, the sandbox of a job they solved is renewed for a later one meanwhile
        # (under the engine's default runtime: a gVisor sandbox is never renewed).
        renewed = recipes is not None and self.settings.limits.runtime is None
        size = min(self.workers + (not renewed), len(jobs))
        records: list[dict[str, Any]] = []
        with (
            SandboxPool(size=size, limits=self.settings.limits) as pool,
            ThreadPoolExecutor(max_workers=self.workers) as threads,
        ):
            work = functools.partial(self._work, queue, batch, pool, running, learning, records)
            try:
                for done in [threads.submit(work) for _ in range(self.workers)]:
                    done.result()
                return records
            except KeyboardInterrupt as stop:
                queue.stop()
                reason = stops.TERMINATED if isinstance(stop, Terminated) else stops.INTERRUPTED
                running.stop(reason)
                threads.shutdown(wait=True, cancel_futures=True)
                self._spans.stopped(reason)
                raise

    def _work(
        self,
        queue: JobQueue,
        batch: "Batch",
        pool: SandboxPool,
        running: Running,
        learning: LayoutLearning | None,
        records: list[dict[str, Any]],
    ) -> None:
        """One thread: job after job until none is left (or a stop came)."""
        while (job := queue.take()) is not None:
            if running.stopping:  # taken as the stop came: not started, nothing recorded
                return
            parked = False
            try:
                record = self._one(job, batch, pool, running, learning)
                parked = record is None
                if record is not None:
                    records.append(record)
            finally:  # also when it raised: the other threads must not wait for it forever
                if not parked:
                    queue.ended()

    def _one(
        self,
        job: Job,
        batch: "Batch",
        pool: SandboxPool,
        running: Running,
        learning: LayoutLearning | None,
    ) -> dict[str, Any] | None:
        folder = batch.output / job.id
        batch.started(waited=job.id in self._parked)
        self._parked.discard(job.id)
        record = None
        try:
            record = run_job(
                job, folder, self.settings, model=self.model, pool=pool, running=running,
                learning=learning, trace_parent=self._spans.traceparent(job.id),
            )  # fmt: skip
            if record is PARKED:
                self._parked.add(job.id)  # before it can be requeued
                batch.parked()
                assert learning is not None  # only a batch that learns parks a job
                learning.settled(job)
                return None
            self._spans.recorded(job.id, record)
            batch.record(record)
            return record
        finally:  # whatever happened: a learning run that ended lets the waiting jobs go
            if learning is not None:
                learning.ended(job.id, record is not None and "recipe_learned" in record)


class Batch:
    """The driver: which jobs are left, the progress bar, results.jsonl. Its executor runs
    the jobs (in threads here, or on a Ray cluster) and hands each record to `record` as it
    ends."""

    def __init__(
        self,
        jobs: list[Job],
        output: Path,
        executor: Executor,
        progress: bool = True,
        runtime: str | None = None,  # the sandboxes' (metrics.prom's runtime label)
    ):
        self.jobs, self.output, self.executor, self.progress = jobs, output, executor, progress
        self.runtime = runtime
        self._lock = threading.Lock()
        self._report_lock = threading.Lock()
        self._reporting = self._report_due = False
        # job counts, then an executor's figures (show): Ray's "slots" is a "2/4" string
        self.counts: dict[str, Any] = {"done": 0, "failed": 0, "running": 0}
        self.skipped = 0  # jobs finished by an earlier run

    def run(self) -> list[dict[str, Any]]:
        """Every job not finished for good yet. Ctrl-C or SIGTERM stops the running jobs (their
        cells interrupted, before their next model call), records them as interrupted (a rerun
        redoes them), starts no more, removes every container, then re-raises."""
        with self.executor:  # first: a backend that cannot run says so before any file or bar
            self.output.mkdir(parents=True, exist_ok=True)
            done = {k: r for k, r in finished(self.output).items() if settled(r)}
            todo = [job for job in self.jobs if job.id not in done]
            self.skipped = len(self.jobs) - len(todo)
            self.bar = tqdm(
                total=len(self.jobs),
                initial=len(self.jobs) - len(todo),
                unit="job",
                disable=not self.progress,
                dynamic_ncols=True,
            )
            try:
                records = self.executor.run(todo, self) if todo else []
            finally:
                self.bar.close()
                write_metrics(self.output, [job.id for job in todo], self.runtime)
        latest = {**done, **{r["id"]: r for r in records}}
        ordered = [latest[j.id] for j in self.jobs if j.id in latest]
        if len(ordered) < sum(1 for _ in _lines(self.output / RESULTS)):
            self._rewrite(ordered)  # retried jobs left older lines: keep one line per job
        self._report()  # also when every job was done already: the report is there
        return ordered

    def _report(self) -> None:
        """report.html and report.md rewritten from results.jsonl (each atomically). One
        thread writes at a time; jobs that end meanwhile are in its next pass, so ending jobs
        neither wait for each other's rewrite nor write an older report over a newer one."""
        with self._report_lock:
            self._report_due = True
            if self._reporting:
                return  # the writing thread makes one more pass, with this job in it
            self._reporting = True
        try:
            while True:
                with self._report_lock:
                    if not self._report_due:  # done: said under the lock a job marks it due
                        self._reporting = False
                        return
                    self._report_due = False
                batch_report.write(self.output, expected=len(self.jobs))
        except BaseException:
            with self._report_lock:
                self._reporting = False
            raise

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        temporary = self.output / (RESULTS + ".tmp")
        with open(temporary, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.output / RESULTS)  # atomic: a kill here loses nothing

    def started(self, waited: bool = False) -> None:
        """A job started (the bar's running count), `waited` when it had been parked."""
        with self._lock:
            self.counts["running"] += 1
            if waited:
                self.counts["waiting"] -= 1
            self.bar.set_postfix(self.counts, refresh=True)

    def parked(self) -> None:
        """A job waits for another's agent run to learn its layout (the bar's waiting count)."""
        with self._lock:
            self.counts["running"] -= 1
            self.counts["waiting"] = self.counts.get("waiting", 0) + 1
            self.bar.set_postfix(self.counts, refresh=True)

    def show(self, **figures: int | str) -> None:
        """Figures beside the bar (an executor adds its own: Ray's nodes and slots)."""
        with self._lock:
            self.counts.update(figures)
            self.bar.set_postfix(self.counts, refresh=True)

    def record(self, record: dict[str, Any]) -> None:
        """A job ended: its line appended to results.jsonl (flushed to disk), the report
        rewritten, the bar moved."""
        with self._lock:
            with open(self.output / RESULTS, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self.counts["running"] -= 1
            self.counts["done" if record["status"] != "failed" else "failed"] += 1
            self.bar.set_postfix(self.counts, refresh=False)
            self.bar.update(1)
        self._report()


def write_metrics(output: Path, ids: list[str], runtime: str | None) -> None:
    """OUT/metrics.prom: the families of agent.metrics over this run's jobs (those that ran
    now, read back from their traces: the same wherever a job ran), in the format of
    Prometheus' textfile collector."""
    metrics = Metrics(runtime)
    try:
        for job_id in ids:
            trace = output / job_id / "trace.jsonl"
            for event in read_events(trace) if trace.exists() else []:
                metrics.observe(event)
        metrics.write(output / METRICS)
    except Exception as error:  # never in the way of the batch's own end (a stop, its report)
        log.warning("%s was not written: %s", output / METRICS, error)
