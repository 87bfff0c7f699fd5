"""`sandcell batch JOBS --output DIR --ray [ADDRESS]`: the same batch on a Ray cluster.

What a batch means does not change (the jobs file, DIR/<id>/, results.jsonl, resume, exit
statuses): `RayExecutor` is the executor `agent.jobs.batch.Batch` runs its jobs with, in place
of the threads of `ThreadExecutor`. Ray does the rest:
- placement: each job is a task asking one unit of the custom resource `sandcell`, which a node
  declares as it joins (`ray start ... --resources '{"sandcell": N}'`: N sandboxes at once);
- the job body: on its node the task hands the job to that node's `NodeRunner` actor, which
  keeps a warm SandboxPool and runs `agent.jobs.batch.run_job`, the code a local job runs;
- retries: a task whose worker or node dies runs again elsewhere, NODE_RETRIES times at most;
- bytes: inputs go out through the object store, each file read once by the driver (or are read
  in place by the node with --shared-paths); the job's folder comes back as bytes and only the
  driver writes DIR/<id>/ and its results line, once, whatever the retries;
- recipes (--recipe auto|DIR): the driver keeps the library and learns, one agent run per
  layout in the whole cluster (agent/jobs/ray_learning.py).

The API key never goes through runtime_env: Ray's runtime-env agent logs env_vars in plain
text. The driver's key travels as an object in the object store; without one, a node uses the
OPENAI_API_KEY of its own environment."""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import ray
from ray.actor import ActorProxy
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sandcell.agent import stops, telemetry
from sandcell.agent.events import Event, SessionStarted
from sandcell.agent.jobs.batch import (
    STOP_WAIT_S,
    Batch,
    Job,
    JobSettings,
    Running,
    failed,
    fresh_folder,
    run_job,
)
from sandcell.agent.jobs.ray_learning import (
    AskDriver,
    Carried,
    ClusterLearning,
    Desk,
    Start,
    Starting,
    ask,
)
from sandcell.agent.model.scripted import ScriptedModel, load_script
from sandcell.agent.model.settings import ModelSettings
from sandcell.agent.seams import Model, Terminated
from sandcell.sandbox import InputError, Inputs, SandboxPool
from sandcell.sandbox.cluster import reachable
from sandcell.sandbox.errors import SandboxUnavailable
from sandcell.sandbox.wheelhouse import on_this_machine

RESOURCE = "sandcell"  # the custom resource a sandbox node declares: sandboxes at once
MAX_INPUT_MB = 512  # a job's inputs through the object store, at most
NODE_RETRIES = 3  # runs of a job again after its worker or node died
SCRATCH_PREFIX = "sandcell-ray-"  # a job's folder on its node (its inputs, its output)
SCRATCH_LOCK = ".in-use"  # flocked by the job while it runs
REFRESH_S = 2.0  # how often the driver looks for new nodes (and updates the bar's figures)

# a job's record (None: parked, to be sent again once its layout's learning run ends), its files
Outcome = tuple[dict[str, Any] | None, dict[str, bytes]]
KeyBox = list[ray.ObjectRef[str]]  # the API key as an object (RayExecutor._key_box)
Blobs = dict[str, ray.ObjectRef[bytes]]  # a job's inputs in the object store, by name


@dataclass(frozen=True)
class Settings:
    """What every job of a batch shares, as sent to the nodes (never the API key): the job
    settings a local batch uses too, and what a node needs to make the model itself."""

    job: JobSettings
    model: ModelSettings  # with no key: that travels as an object (RayExecutor._key_box)
    shared_paths: bool = False


@dataclass(frozen=True)
class RemoteJob:
    id: str
    task: str
    inputs: dict[str, str]  # name under /data -> the driver's path
    replies: list | None = None  # the job's script of replies, read by the driver
    replay_name: str | None = None
    expect: dict | None = None  # the job's declared checks (agent.output_checks.Expect)
    carried: Carried | None = None  # in a batch that learns recipes: its layout and recipes
    trace_parent: str | None = None  # the driver's span of the job (OTEL_* on there)


def runner_name(node_id: str) -> str:
    return f"sandcell-node-{node_id}"


class NodeRunner:
    """One per node: its warm pool and the jobs running there (so a stop reaches them)."""

    def __init__(self, pool_size: int, settings: Settings, key_box: KeyBox | None):
        # each node mounts its own wheelhouse: the driver's folder when this node has it
        limits = settings.job.limits
        limits = replace(limits, wheelhouse=on_this_machine(limits.wheelhouse))
        settings = replace(settings, job=replace(settings.job, limits=limits))
        self.settings, self.key_box = settings, key_box
        remove_dead_scratch()
        self.pool = SandboxPool(size=pool_size, limits=settings.job.limits)
        self.running = Running()
        # one endpoint client for the node's jobs: it is thread-safe
        self._model: Model | None = None
        self._lock = threading.Lock()

    def model(self) -> Model:
        with self._lock:
            if self._model is None:
                self._model = endpoint_model(self.settings, self.key_box)
            return self._model

    def run(self, job: RemoteJob, blobs: Blobs, desk: Any) -> Outcome | None:
        """The job's record and files; None once stopping (not started, nothing recorded)."""
        if self.running.stopping:
            return None
        return run_here(
            job, blobs, self.settings, self.key_box, self.pool, self.running, self.model, desk
        )

    def stop(self, reason: str, within: float) -> None:
        self.running.stop(reason, within)

    def close(self) -> None:
        self.pool.close()
        remove_dead_scratch()  # and what a batch killed just before this one left
        telemetry.close()  # the driver kills this actor next (no exit handlers run)


def dead_scratch() -> list[Path]:
    """The scratch folders of jobs whose Ray worker was killed (its node removed, the driver
    killed). A folder is in use while its job holds the flock on its lock file (the kernel
    lets go of it when the worker dies, whatever its pid namespace); one whose lock can be
    taken is dead."""
    dead = []
    for lock_file in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*/{SCRATCH_LOCK}"):
        try:
            with open(lock_file) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (BlockingIOError): its job runs; or gone meanwhile
            continue
        dead.append(lock_file.parent)
    return dead


def remove_dead_scratch() -> None:
    """A worker that dies cannot clean up its folder: the next runner on the node does."""
    for folder in dead_scratch():
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def scratch_folder() -> Iterator[Path]:
    """A job's folder on its node, locked while the job runs, removed after it."""
    work = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    try:
        with open(work / f"{SCRATCH_LOCK}.new", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            os.rename(lock.name, work / SCRATCH_LOCK)  # found by the cleaner only once held
            yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def endpoint_model(settings: Settings, key_box: KeyBox | None) -> Model:
    from sandcell.agent.model.openai_model import OpenAIModel  # loads openai: on the nodes only

    key = ray.get(key_box[0]) if key_box else None  # else OPENAI_API_KEY of the node
    return OpenAIModel.from_settings(replace(settings.model, api_key=key).filled())


def run_here(
    job: RemoteJob,
    blobs: Blobs,
    settings: Settings,
    key_box: KeyBox | None,
    pool: SandboxPool | None,
    running: Running,
    model: Callable[[], Model] | None = None,
    desk: Any = None,
) -> Outcome | None:
    """Run one job on this node through run_job, in a scratch folder removed afterwards; the
    record and the folder's files as bytes (relative path -> content). In a batch that learns
    recipes the job first asks the driver (`desk`) whether it may start, and with which."""
    node = ray.get_runtime_context().get_node_id()
    learning, job_settings = None, settings.job
    if job.carried is not None:
        carried = tuple(e.name for e in job.carried.recipes.entries)
        start: Start | None = ask(desk, Starting(job.id, job.carried.layout.key, carried), running)
        if start is None:  # stopping: not started, nothing recorded
            return None
        if start.parked:
            return None, {}
        job_settings = replace(job_settings, recipes=start.recipes or job.carried.recipes)
        learning = AskDriver(desk, running, start.learned)
    with scratch_folder() as work:
        try:
            inputs = Inputs.from_paths(_inputs_here(job, blobs, work / "inputs", settings))
        except InputError as error:
            where = " (with --shared-paths every node reads the inputs at the driver's path)"
            record: dict[str, Any] = {
                "id": job.id,
                "task": job.task,
                "status": "failed",
                "stop_reason": "error",
            }
            record["error"] = f"InputError: on node {node[:12]}: {error}" + (
                where if settings.shared_paths else ""
            )
            return record | {"node": node}, {}

        def make_model(_job: Job) -> Model:  # called inside run_job: its errors are recorded
            if job.replies is not None:
                return ScriptedModel(job.replies, name=job.replay_name)
            return model() if model else endpoint_model(settings, key_box)

        folder = work / "out" / job.id  # its name: the session's (a trace's conversation id)
        here = Job(job.id, job.task, inputs, expect=job.expect or {})
        ran = run_job(
            here, folder, job_settings, model=make_model, pool=pool, running=running,
            learning=learning, layout=job.carried.layout if job.carried else None,
            trace_parent=job.trace_parent,
        )  # fmt: skip
        if ran is None:  # parked: its layout is being learned (or was, since it chose)
            return None, {}
        return ran | {"node": node}, _files(folder)


def _inputs_here(
    job: RemoteJob, blobs: Blobs, folder: Path, settings: Settings
) -> Mapping[str, str | Path]:
    """{name: path on this node}: the driver's paths (a shared filesystem), or the bytes from
    the object store written to a scratch folder (read-only: the sandbox mounts them)."""
    if settings.shared_paths:
        return job.inputs
    folder.mkdir(parents=True)
    names = list(blobs)
    paths: dict[str, Path] = {}
    for name, data in zip(names, ray.get([blobs[n] for n in names]), strict=True):
        path = folder / name
        path.write_bytes(data)
        path.chmod(0o444)
        paths[name] = path
    return paths


def _files(folder: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root, name)
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(folder))] = path.read_bytes()
    return found


_runner: list[ActorProxy[NodeRunner]] = []  # this worker's node runner, looked up once


def job_task(
    job: RemoteJob, blobs: Blobs, settings: Settings, key_box: KeyBox | None, desk: Any
) -> Outcome | None:
    """A job placed by Ray on a node with a free `sandcell` unit: run by that node's runner,
    or here with a fresh sandbox when the node has none (it joined after the batch began)."""
    if not _runner:
        try:
            _runner.append(ray.get_actor(runner_name(ray.get_runtime_context().get_node_id())))
        except ValueError:
            return run_here(job, blobs, settings, key_box, None, Running(), desk=desk)
    # ray types an actor's methods only when @ray.method-decorated: .remote is unknown to it
    ran: ray.ObjectRef[Outcome | None]
    ran = _runner[0].run.remote(job, blobs, desk)  # type: ignore[attr-defined]
    return ray.get(ran)


class InputStore:
    """A batch's inputs in Ray's object store: each file read as the first job needing it
    goes, dropped by the driver once no job left to send needs it (Ray keeps it while a sent
    job does); a job that comes back parked needs its files again."""

    def __init__(self, jobs: list[Job]):
        self._uses = Counter(item.path for job in jobs for item in job.inputs)
        self._stored: dict[Path, ray.ObjectRef[bytes]] = {}

    def send(self, job: Job) -> Blobs:
        """{name: ObjectRef of the file's bytes}."""
        blobs: Blobs = {}
        for item in job.inputs:
            if item.path not in self._stored:
                self._stored[item.path] = ray.put(item.path.read_bytes())
            blobs[item.name] = self._stored[item.path]
            self._uses[item.path] -= 1
            if not self._uses[item.path]:
                del self._stored[item.path]
        return blobs

    def returned(self, job: Job) -> None:
        self._uses.update(item.path for item in job.inputs)


class RayExecutor:
    """A batch's jobs on a Ray cluster (`agent.jobs.batch.Executor`): they go out as tasks, at most
    twice the slots at a time (so the object store holds the inputs of those only), and each
    result is written as it comes back."""

    def __init__(
        self,
        settings: Settings,
        *,
        api_key: str | None = None,
        address: str | None = None,
        max_input_mb: int = MAX_INPUT_MB,
    ):
        recipes = settings.job.recipes
        # a library that learns stays here (ray_learning): each job takes its own recipes
        self.library = recipes if recipes is not None and recipes.learning else None
        if self.library is not None:
            settings = replace(settings, job=replace(settings.job, recipes=None))
        self.settings, self.api_key, self.max_input_mb = settings, api_key, max_input_mb
        self._parked: set[str] = set()  # ids of the jobs waiting for a layout's learning run
        self._spans = telemetry.JobSpans()
        self.address = address or os.environ.get("RAY_ADDRESS") or "auto"
        self.runners: dict[str, ActorProxy[NodeRunner]] = {}
        self._runner_class = ray.remote(NodeRunner)
        self.slots = 0
        self.figures: dict[str, int | str] = {"nodes": 0, "slots": "0/0"}
        self._sigterm = False
        self._restore_sigterm: Callable[[int, FrameType | None], Any] | None = None

    def __enter__(self) -> RayExecutor:
        """Connected: a cluster that is not there (or offers no sandboxes) is said before the
        bar shows."""
        self._sigterm = False
        try:
            self._connect()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """The runners and their sandboxes go away; the SIGTERM handler is the one before."""
        try:
            self._close_runners()
            ray.shutdown()
            self.__dict__.pop("_key_box", None)  # its object went with the connection
        finally:
            if self._restore_sigterm is not None:
                signal.signal(signal.SIGTERM, self._restore_sigterm)
                self._restore_sigterm = None

    def run(self, jobs: list[Job], batch: Batch) -> list[dict[str, Any]]:
        todo = [replace(job, inputs=Inputs.from_paths(job.inputs)) for job in jobs]
        self._refresh(len(todo))  # a runner per node, its pool sized for the jobs left
        batch.show(**self.figures)
        return self._run_all(todo, batch)

    def _connect(self) -> None:
        reachable(self.address)
        before = signal.getsignal(signal.SIGTERM)  # ray.init puts a plain exit there
        try:
            ray.init(
                address=self.address,
                namespace=f"sandcell-batch-{uuid.uuid4().hex[:12]}",  # runner names: this batch's
                logging_level=logging.ERROR,
                log_to_driver=False,  # a job's story is its trace; the bar stays readable
            )
        except ConnectionError as error:
            raise SandboxUnavailable(
                f"no Ray cluster answers at {self.address} ({error}); start one with "
                "`ray start --head --resources '{\"sandcell\": 2}'` or give --ray ADDRESS"
            ) from None
        finally:
            signal.signal(signal.SIGTERM, before)
        if callable(before):  # note a SIGTERM, then handle it as before (exits: Terminated)

            def noted(signum: int, frame: FrameType | None) -> None:
                self._sigterm = True
                before(signum, frame)

            signal.signal(signal.SIGTERM, noted)
            self._restore_sigterm = before
        self._refresh(0)
        if not self.slots:
            raise SandboxUnavailable(
                f"no node of the Ray cluster at {self.address} offers the `{RESOURCE}` "
                "resource; start each node that has Docker and the image with `ray start "
                f"--address ... --resources '{{\"{RESOURCE}\": N}}'`"
            )

    def _refresh(self, jobs: int) -> None:
        """Start a runner on each node that offers sandboxes and has none (its pool one more
        than its slots, so the next job's sandbox is ready when a job ends, and no more than
        the `jobs` left); the bar's nodes and slots in use."""
        nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get(RESOURCE)]
        for node in nodes if jobs else ():
            node_id = node["NodeID"]
            if node_id in self.runners:
                continue
            slots = int(node["Resources"][RESOURCE])
            self.runners[node_id] = self._runner_class.options(
                name=runner_name(node_id),
                num_cpus=0,
                max_concurrency=slots + 4,  # its jobs, and a stop or close beside them
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(min(slots + 1, jobs), self.settings, self._key_box)
        self.slots = int(sum(n["Resources"][RESOURCE] for n in nodes))
        self._refreshed = time.monotonic()
        free = ray.available_resources().get(RESOURCE, 0)
        self.figures = {"nodes": len(nodes), "slots": f"{self.slots - int(free)}/{self.slots}"}

    @functools.cached_property
    def _key_box(self) -> KeyBox | None:
        """The key as an object, in a list so no task spec ever carries it inline."""
        return [ray.put(self.api_key)] if self.api_key else None

    @functools.cached_property
    def _task(self) -> Any:
        return ray.remote(job_task).options(
            num_cpus=0,
            resources={RESOURCE: 1},
            max_retries=NODE_RETRIES,
            # the node's runner gone under the job (its node is going down): run it again
            retry_exceptions=[ray.exceptions.RayActorError],
        )

    def _run_all(self, todo: list[Job], batch: Batch) -> list[dict[str, Any]]:
        inputs = None if self.settings.shared_paths else InputStore(todo)
        queue = deque(todo)
        learning = None
        if self.library is not None:
            learning = ClusterLearning(self.library, lambda jobs: queue.extendleft(reversed(jobs)))
        desk, asked = self._desk() if learning is not None else (None, None)
        pending: dict[ray.ObjectRef[Outcome | None], Job] = {}
        records: list[dict[str, Any]] = []
        try:
            while queue or pending:
                while queue and len(pending) < 2 * max(1, self.slots):
                    job = queue.popleft()
                    batch.started(waited=job.id in self._parked)
                    self._parked.discard(job.id)
                    refused = self._too_big(job)
                    if refused:
                        records.append(self._failed(job, refused, batch))
                        continue
                    carried = learning.place(job) if learning is not None else None
                    if learning is not None and carried is None:  # waits here, holding nothing
                        self._park(job, batch)
                        continue
                    blobs = inputs.send(job) if inputs is not None else {}
                    sent = self._remote(job, carried, self._spans.traceparent(job.id))
                    pending[self._task.remote(sent, blobs, self.settings, self._key_box, desk)] = (
                        job
                    )
                ready, _ = ray.wait([*pending, *filter(None, [asked])], num_returns=1, timeout=1.0)
                for ref in ready:
                    if ref == asked:  # node jobs' questions to the layout learning
                        assert learning is not None and desk is not None  # only when learning
                        asked = self._answer(desk, ref, learning)
                        continue
                    job = pending.pop(ref)
                    record = self._collect(ref, job, batch, learning)
                    if record is not None:
                        records.append(record)
                    elif inputs is not None:  # parked: it goes again, and its inputs with it
                        inputs.returned(job)
                if time.monotonic() - self._refreshed > REFRESH_S:
                    self._refresh(len(queue) + len(pending))
                    batch.show(**self.figures)
        except KeyboardInterrupt as stop:
            # Ray's wait turns the Terminated our SIGTERM handler raises into a plain
            # KeyboardInterrupt: the flag says which signal it was
            terminated = isinstance(stop, Terminated) or self._sigterm
            records += self._stop_all(
                stops.TERMINATED if terminated else stops.INTERRUPTED, pending, batch, learning
            )
            if terminated and not isinstance(stop, Terminated):
                raise Terminated() from None
            raise
        return records

    def _desk(self) -> tuple[Any, ray.ObjectRef[Any]]:
        """The desk node jobs ask the driver's layout learning at, beside the driver, and
        the driver's standing call for their questions."""
        here = ray.get_runtime_context().get_node_id()
        desk = (
            ray.remote(Desk)
            .options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True),
                max_restarts=-1,  # restarted, it loses the questions in flight: their jobs rerun
            )
            .remote()
        )
        return desk, desk.questions.remote()  # type: ignore[attr-defined]  # as in job_task

    def _answer(self, desk: Any, asked: ray.ObjectRef[Any], learning: ClusterLearning) -> Any:
        """Each question waiting at the desk answered; the next standing call for more."""
        try:
            questions = ray.get(asked)
        except ray.exceptions.RayActorError:  # the desk restarted: its askers' tasks rerun
            questions = []
        for number, question in questions:
            desk.answer.remote(number, learning.answer(question))
        return desk.questions.remote()

    def _park(self, job: Job, batch: Batch) -> None:
        self._parked.add(job.id)
        batch.parked()

    def _too_big(self, job: Job) -> str | None:
        if self.settings.shared_paths:
            return None
        size = sum(item.size or 0 for item in job.inputs)
        if size <= self.max_input_mb << 20:
            return None
        return (
            f"InputError: its inputs are {size / 2**20:.1f} MB, over the {self.max_input_mb} MB "
            "a job may send through Ray's object store; raise --max-input-mb, or put the files "
            "where every node reads them at the same path and pass --shared-paths"
        )

    def _remote(
        self, job: Job, carried: Carried | None = None, trace_parent: str | None = None
    ) -> RemoteJob:
        replies = None
        if job.replay is not None:
            replies = [entry for _, entry in load_script(job.replay)]
        return RemoteJob(
            job.id,
            job.task,
            {item.name: str(item.path) for item in job.inputs},
            replies,
            f"replay:{job.replay.name}" if job.replay else None,
            job.expect,
            carried,
            trace_parent,
        )

    def _collect(
        self,
        ref: ray.ObjectRef[Outcome | None],
        job: Job,
        batch: Batch,
        learning: ClusterLearning | None,
    ) -> dict[str, Any] | None:
        """The job's record; its folder written under DIR/<id>/ first, a recipe learnt from
        it, then its results line. None when it came back parked (it goes again later)."""
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayError as error:
            lost = self._failed(job, _lost(error), batch)
            if learning is not None:
                learning.lost(job)
            return lost
        assert outcome is not None  # a runner gives None only once stopping (_stop_all)
        record, files = outcome
        if record is None:
            assert learning is not None  # only a batch that learns parks a job
            self._park(job, batch)
            learning.parked(job)
            return None
        return self._write(job, record, files, batch, learning)

    def _write(
        self,
        job: Job,
        record: dict[str, Any],
        files: dict[str, bytes],
        batch: Batch,
        learning: ClusterLearning | None,
    ) -> dict[str, Any]:
        """DIR/<id>/ from the node's bytes, the recipe learnt from it, then its results line."""
        if not self.settings.shared_paths:
            files = driver_paths(files, job)
        write_folder(batch.output / job.id, files)
        if learning is not None:
            try:
                learning.ended(job, record, batch.output / job.id)
            except Exception as error:  # one job's failure is recorded, as run_job does locally
                learning.lost(job)
                record = failed(job, f"{type(error).__name__}: {error}")
        return self._record(job, record, batch)

    def _failed(self, job: Job, error: str, batch: Batch) -> dict[str, Any]:
        return self._record(job, failed(job, error), batch)

    def _record(self, job: Job, record: dict[str, Any], batch: Batch) -> dict[str, Any]:
        self._spans.recorded(job.id, record)
        batch.record(record)
        return record

    def _stop_all(
        self,
        reason: str,
        pending: dict[ray.ObjectRef[Outcome | None], Job],
        batch: Batch,
        learning: ClusterLearning | None,
    ) -> list[dict[str, Any]]:
        """Ctrl-C or SIGTERM: every node stops its running jobs, which come back interrupted
        and are recorded (a rerun redoes them); jobs not started yet are cancelled."""
        for runner in self.runners.values():
            runner.stop.remote(reason, STOP_WAIT_S)  # type: ignore[attr-defined]  # as in job_task
        records: list[dict[str, Any]] = []
        deadline = time.monotonic() + STOP_WAIT_S + 10
        while pending and time.monotonic() < deadline:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                job = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError:
                    result = None  # cancelled or lost
                if result is None or result[0] is None:  # not started, or parked: a rerun runs it
                    continue
                records.append(self._write(job, result[0], result[1], batch, learning))
        for ref in pending:
            ray.cancel(ref)
        self._spans.stopped(reason)  # not started, parked or cancelled: a rerun runs them
        return records

    def _close_runners(self) -> None:
        """Each runner removes its warm sandboxes; one whose node died is gone already."""
        runners = self.runners.values()  # ray types .remote only under @ray.method (job_task)
        closing = [runner.close.remote() for runner in runners]  # type: ignore[attr-defined]
        try:
            if closing:
                ray.wait(closing, num_returns=len(closing), timeout=120)
        finally:
            for runner in self.runners.values():
                # ray's own ActorClass.remote() gives ActorHandle | type, which kill() refuses
                ray.kill(runner)  # type: ignore[arg-type]
            self.runners.clear()


def _lost(error: Exception) -> str:
    """Why a job did not come back: its worker, node or runner died on every try, or the
    code on the node raised (a bug: run_job records the job's own failures)."""
    cause = getattr(error, "cause", None)
    if isinstance(error, ray.exceptions.RayTaskError) and not isinstance(
        cause, ray.exceptions.RayError
    ):
        return f"{type(cause).__name__}: on its node: {cause}"
    first = next(iter(str(cause or error).strip().splitlines()), "")
    return (
        f"{type(cause or error).__name__}: the job's Ray worker or node died on each of "
        f"{NODE_RETRIES + 1} tries ({first})"
    )


def driver_paths(files: dict[str, bytes], job: Job) -> dict[str, bytes]:
    """The trace names each input where the driver read it, not at the node's scratch copy
    (the same bytes, the same sha256), so `sandcell replay DIR/<id>/trace.jsonl` finds it."""
    raw = files.get("trace.jsonl")
    if not raw:
        return files
    head, newline, rest = raw.partition(b"\n")
    match Event.from_json(json.loads(head)):
        case SessionStarted(inputs=inputs) as event:
            moved = [_at_driver(item, job) for item in inputs or []]
            line = json.dumps(replace(event, inputs=moved).to_json(), ensure_ascii=False)
            return {**files, "trace.jsonl": line.encode() + newline + rest}
    return files


def _at_driver(item: object, job: Job) -> object:
    if not isinstance(item, dict) or not isinstance(name := item.get("name"), str):
        return item
    source = job.inputs.get(name)
    return item if source is None else {**item, "path": str(source.path)}


def write_folder(folder: Path, files: dict[str, bytes]) -> None:
    """DIR/<id>/ from the bytes a node sent back (an earlier attempt's folder removed)."""
    fresh_folder(folder)
    root = folder.resolve()
    for name, data in files.items():
        path = (folder / name).resolve()
        if root not in path.parents:  # only paths under the folder, whatever a node sends
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
