"""The Python API: `Agent(model=..., limits=...).run(task, inputs=[...]) -> RunResult`, and
`agent.session(inputs=[...])` for several questions sharing one sandbox (kernel state, files,
history). Each question leaves trace.jsonl and notebook.ipynb up to date in the session folder,
and the files the code wrote under /workspace/output copied to <folder>/output. A session's own
sandbox starts as `Agent(sandbox_start=)` says: in the background as the session is created (the
first model request and the start overlap), or on demand at the first Python action; a sandbox
given to it (`sandbox=`: a pool's, or a resumed one) is used as it is."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self, TypeGuard

from sandcell.agent import stops
from sandcell.agent.events import (
    ATTEMPT,
    Event,
    ExportFailed,
    InputsAdded,
    OnEvent,
    Output,
    Reset,
    SandboxPaused,
    SandboxReady,
    SessionStarted,
    cell_events,
    fan_out,
    sandbox_started,
)
from sandcell.agent.loop import Loop
from sandcell.agent.output_checks import (
    Checker,
    Expect,
    Schema,
    describe,
    load_expect,
    not_checked,
    verify_copied,
)
from sandcell.agent.prompts import inputs_profile, packages_note
from sandcell.agent.records.notebook import export_notebook
from sandcell.agent.records.trace import TraceWriter
from sandcell.agent.seams import Model, RunResult
from sandcell.agent.stops import Rules
from sandcell.agent.telemetry import spans_for
from sandcell.sandbox import (
    BackgroundSandbox,
    DockerSandbox,
    Execution,
    Inputs,
    Limits,
    Sandbox,
    checkpoint,
)
from sandcell.sandbox.boundary import WORKSPACE
from sandcell.sandbox.container import DEFAULT_IMAGE
from sandcell.sandbox.docker_sandbox import wheelhouse_offer
from sandcell.sandbox.execution import StreamChunk
from sandcell.sandbox.landing import files_in, move_inside
from sandcell.sandbox.pool import warmed
from sandcell.tools import Registry, Tool, calculator_tool
from sandcell.tools.file_metadata import file_metadata_tool
from sandcell.tools.python import python_tool

OUTPUT_DIR = "output"  # /workspace/output: what a job hands back
FIGURES_DIR = "figures"  # /workspace/figures: every chart a cell showed
WORKSPACE_DIR = "workspace"  # every other file the code wrote under /workspace
PAUSED_DIR = ".paused"  # a paused kernel's checkpoint (its memory): hidden, owner-only
BACKGROUND, ON_DEMAND = "background", "on_demand"  # when a session's own sandbox starts
InputPaths = Inputs | Mapping[str, str | Path] | Sequence[str | Path]  # Inputs.from_paths


def collected_place(name: str) -> tuple[str, str]:
    """Where collect puts a workspace file, as (folder of the session, path in it):
    output/ and figures/ as they are, every other file under workspace/."""
    top, _, rest = name.partition("/")
    if top in (OUTPUT_DIR, FIGURES_DIR) and rest:
        return top, rest
    return WORKSPACE_DIR, name


class Agent:
    def __init__(
        self,
        model: Model,
        *,
        limits: Limits | None = None,
        rules: Rules | None = None,
        protocol: str = "auto",
        vision: str = "auto",
        image: str | None = None,
        extra_tools: list[Tool] | None = None,
        on_event: OnEvent | None = None,
        sandbox_start: str = BACKGROUND,
    ):
        self.model, self.limits, self.rules = model, limits or Limits(), rules or Rules()
        self.protocol, self.image, self.on_event = protocol, image, on_event
        self.vision = vision  # auto, on or off: the model sees the figures (agent.vision)
        self.extra_tools = list(extra_tools or [])
        if sandbox_start not in (BACKGROUND, ON_DEMAND):
            raise ValueError(f"sandbox_start is {BACKGROUND!r} or {ON_DEMAND!r}")
        self.sandbox_start = sandbox_start

    def run(
        self,
        task: str,
        inputs: InputPaths = (),
        output_dir: str | Path | None = None,
        expect: Mapping[str, str | Path | Schema] | None = None,
    ) -> RunResult:
        """Answer one task in a fresh sandbox, then close it. `expect` maps output paths
        under /workspace to pandera schema files ({"output/clean.csv": "sales.yaml"}): the
        answer is accepted only once those files pass (RunResult.checks says how they did)."""
        with self.session(inputs, output_dir, expect=expect) as session:
            return session.ask(task)

    def session(
        self,
        inputs: InputPaths = (),
        output_dir: str | Path | None = None,
        sandbox: Sandbox | Callable[[], Sandbox] | None = None,
        expect: Mapping[str, str | Path | Schema] | None = None,
        trace_parent: str | None = None,
    ) -> Session:
        """A conversation in one sandbox: by default a new DockerSandbox, started in the
        background. Pass a Sandbox to use it, or a function that makes one (e.g. a pool's
        acquire) to have it called in the background; the session closes its sandbox.
        `expect`: declared output checks, as for run() (schema paths relative to here).
        `trace_parent`: the W3C traceparent its questions' spans go under (OTEL_* on)."""
        checks = load_expect(expect, Path.cwd()) if expect else {}  # a bad schema: now
        inputs_ = Inputs.from_paths(inputs)
        return Session(self, inputs_, output_dir, sandbox, checks, trace_parent)


class Session:
    def __init__(
        self,
        agent: Agent,
        inputs: Inputs,
        output_dir: str | Path | None,
        sandbox: Sandbox | Callable[[], Sandbox] | None,
        expect: Expect | None = None,
        trace_parent: str | None = None,
    ):
        self.agent, self.inputs, self.expect = agent, inputs, expect or {}
        # set by a batch whose job a recipe solved: where the sandbox goes instead of close()
        # (SandboxPool.release renews it for the next job; never after the model's agent ran)
        self.hand_back: Callable[[Sandbox], object] | None = None
        self._idle = threading.Event()  # no question running
        self._idle.set()
        self.folder = Path(output_dir or tempfile.mkdtemp(prefix="sandcell-session-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trace_path = self.folder / "trace.jsonl"
        self.notebook_path = self.folder / "notebook.ipynb"
        self.trace = TraceWriter(self.trace_path)
        # the trace first, then the spans (OTEL_*: else None), then the UI
        spans = spans_for(self.folder.name, trace_parent)
        self._publish = fan_out(self.trace, spans, agent.on_event)
        self.publish(self._started(sandbox))
        self.sandbox = self._sandbox(sandbox)
        try:
            self.registry = Registry(
                [
                    python_tool(self.sandbox, on_output=self._output if agent.on_event else None),
                    calculator_tool,
                    file_metadata_tool(inputs, self.sandbox),
                    *agent.extra_tools,
                ]
            )
            self.checker = self._checker()
            self.loop = Loop(
                agent.model,
                self.registry,
                self.publish,
                protocol=agent.protocol,
                vision=agent.vision,
                rules=agent.rules,
                inputs_profile=self._described(),
                packages=self._packages(),
                allow_net=agent.limits.allow_net,
                verify=self.checker,
            )
        except BaseException:  # re-raised: the sandbox begun above must not outlive it
            self.sandbox.close()
            self.trace.close()
            raise

    def _started(self, sandbox: Sandbox | Callable[[], Sandbox] | None) -> SessionStarted:
        """The trace's first record: what this session runs with."""
        agent = self.agent
        return SessionStarted(
            model=getattr(agent.model, "name", type(agent.model).__name__),
            max_tokens=getattr(agent.model, "max_tokens", None),  # the cap on each reply
            protocol=agent.protocol,
            inputs=self.inputs.to_trace(),
            image=agent.image or DEFAULT_IMAGE,
            limits=agent.limits.to_dict(),
            rules=vars(agent.rules),
            sandbox_start="given" if _is_sandbox(sandbox) else agent.sandbox_start,
            vision=agent.vision,
        )

    def _sandbox(self, given: Sandbox | Callable[[], Sandbox] | None) -> Sandbox:
        """The sandbox given, or one begun now (by `given`, else a fresh DockerSandbox),
        beside the first model request: the first Python action waits for it."""
        if _is_sandbox(given):
            return given
        factory = given if callable(given) else None  # not a sandbox: a factory, or None
        agent, inputs = self.agent, self.inputs
        return BackgroundSandbox(
            factory or (lambda: warmed(DockerSandbox(agent.limits, inputs, agent.image))),
            agent.limits,
            inputs,
            background=agent.sandbox_start == BACKGROUND,
            on_ready=self.sandbox_ready,
        )

    def _checker(self) -> Checker | None:
        """The declared checks on the outputs, when the task has any."""
        if not self.expect:
            return None
        limits = self.agent.limits
        return Checker(
            self.expect,
            self.sandbox,
            self.publish,
            self.agent.rules.check_retries,
            max_bytes=limits.workspace_mb << 20,
        )

    def _described(self) -> str:
        """What the system prompt says of the task's files: the inputs' profiles, then the
        outputs' expected schemas."""
        profiles = inputs_profile(self.inputs, self.agent.limits.memory_mb)
        return "\n\n".join(t for t in (profiles, describe(self.expect)) if t)

    def _packages(self) -> str:
        """What the prompt says of packages, when the operator gave a wheelhouse."""
        agent = self.agent
        return packages_note(wheelhouse_offer(None, agent.image, agent.limits.wheelhouse))

    def publish(self, event: Event) -> None:
        """One fact of the session, to the trace and to the front end (Agent's on_event)."""
        self._publish(event)

    def sandbox_ready(self, timing: dict) -> None:
        """A sandbox started for the session (or failed to: `error`): when, and how long it
        took (the trace's)."""
        self.publish(sandbox_started(timing))

    def ask(self, question: str) -> RunResult:
        """Answer one question. Ctrl-C (or SIGTERM) ends it with what was done kept: the trace,
        the notebook of the finished cells, the files; the result says it was interrupted."""
        with self._busy():
            return self._ask(question)

    @contextmanager
    def _busy(self) -> Iterator[None]:
        """Code runs for this session (a question, a recipe's cells): stop() waits for it."""
        self._idle.clear()
        try:
            yield
        finally:
            self._idle.set()

    def _ask(self, question: str) -> RunResult:
        result = self.loop.ask(question)
        if result.stop_reason in (stops.INTERRUPTED, stops.TERMINATED):
            self.sandbox.interrupt()  # the cell it cut short
        if self.checker is not None:
            result.checks = self._checks(self.checker, result)
        return self.settle(result)

    def run_cells(self, cells: list[str]) -> tuple[int, Execution] | None:
        """Run cells without the model (a recipe), each recorded as serve's /execute cells
        are; stop at the first that fails or is stopped: its index and Execution, else None.
        A cancel (Ctrl-C, SIGTERM) interrupts the running cell and ends it there."""
        with self._busy():
            for index, code in enumerate(cells):
                execution = self.sandbox.run(code)
                self.executed(code, execution)
                if not execution.ok or execution.interrupted or self.loop.cancelled:
                    return index, execution
            return None

    def settle(self, result: RunResult) -> RunResult:
        """A question's result made whole: the trace and the notebook named, the files the
        code made copied back, and those the checks read compared with what was copied."""
        result.trace_path = self.trace_path
        result.notebook_path = export_notebook(self.trace_path, self.notebook_path)
        if not self.sandbox_used:
            return result  # no code ran: nothing to copy, and no container to wait for
        result.files, problems = self.bring_back()
        result.warnings.extend(problems)
        if result.checks is not None:
            self._verify_copied(result, result.checks)
        return result

    def _checks(self, checker: Checker, result: RunResult) -> dict:
        """The results' `checks`: the last run's, when the question ended at a check."""
        last = checker.last
        if (
            last is not None
            and checker.question == self.loop.questions
            and (result.stop_reason in (stops.ANSWERED, stops.CHECKS_FAILED))
        ):
            return last.record()
        why = f"the question stopped ({result.stop_reason}) before its outputs were checked"
        return not_checked(self.expect, why)

    def _verify_copied(self, result: RunResult, checks: dict) -> None:
        """The files copied back must be the bytes checked: else the checks failed."""

        def place(path: str) -> Path:
            return self.folder.joinpath(*collected_place(path))

        problems = verify_copied(checks, place)
        if problems and result.answered:
            result.stop_reason = stops.CHECKS_FAILED
            result.detail = "; ".join(problems)
        result.warnings.extend(problems)

    def bring_back(self) -> tuple[list[str], list[str]]:
        """collect(), where every failure becomes a warning (also in the trace): copying files
        back must never lose an answer nor stop a sandbox's release. The host paths copied,
        and the warnings."""
        try:
            copied, skipped = self.collect()
        # Any error: a dead container (SandboxError), a file turned folder (OSError), an
        # engine gone (requests' and docker's errors); none is hidden: each is a warning.
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            self.publish(ExportFailed(error=error))
            return [], [f"the files under {WORKSPACE} were not copied: {error}"]
        if not skipped:
            return copied, []
        self.publish(ExportFailed(error="some files were not copied", files=skipped))
        shown = "; ".join(skipped[:5]) + (
            f"; and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        )
        return copied, [f"{len(skipped)} file(s) under {WORKSPACE} were not copied: {shown}"]

    def collect(self) -> tuple[list[str], list[str]]:
        """Bring back what the code made: /workspace/output to <folder>/output, the charts to
        <folder>/figures, every other file it wrote to <folder>/workspace/. Only the regular
        files on disk after the export move, never a name the archive gave, each checked to
        stay inside its folder; one that cannot be put in place (a folder is there now) is
        skipped. The host paths copied, and "<file>: <why>" for each skipped."""
        staging = Path(tempfile.mkdtemp(prefix=".collect-", dir=self.folder))
        try:
            self.sandbox.export(staging)
            copied, skipped = [], []
            for name in files_in(staging):
                root, rel = collected_place(name)
                try:
                    copied.append(str(move_inside(staging / name, self.folder / root, rel)))
                except OSError as error:
                    skipped.append(f"{name}: {error.strerror or error}")
            return copied, skipped
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def cancel(self, reason: str = stops.INTERRUPTED) -> None:
        """Stop the running question from another thread: its cell is interrupted, a reply
        streaming in is dropped, and it ends before anything more runs."""
        self.loop.cancel(reason)
        self.sandbox.interrupt()

    def stop(self, reason: str = stops.INTERRUPTED, within: float = 30.0) -> bool:
        """Cancel the running question and wait for it to end, interrupting again each second
        (a cell that started just after the cancel is stopped too); False if it did not end
        within the time (chat and batch before they close the session)."""
        self.cancel(reason)
        deadline = time.monotonic() + within
        while not self._idle.wait(1.0):
            if time.monotonic() > deadline:
                return False
            self.sandbox.interrupt()
        return True

    def _output(self, chunk: StreamChunk) -> None:
        """A running cell's stdout/stderr, to the UI as it arrives."""
        self.publish(Output(name=chunk.name, text=chunk.text))

    @property
    def sandbox_used(self) -> bool:
        """Whether anything ran in the sandbox (a question answered without code: no)."""
        return not isinstance(self.sandbox, BackgroundSandbox) or self.sandbox.used

    def export(self, host_dir: str | Path, folder: str = OUTPUT_DIR) -> list[str]:
        """Copy one folder of /workspace (all of it for "") to host_dir; the host paths."""
        copied = self.sandbox.export(host_dir, folder)
        return [str(Path(host_dir) / name) for name in copied]

    def files(self) -> list[dict]:
        return self.sandbox.files()

    def add_inputs(self, paths: InputPaths) -> Inputs:
        """More input files for a session that has started (an upload): checked as --input is,
        added read-only under /data in its sandbox (one still starting is waited for), and
        described to the model from its next request on, by the prompt and by file_metadata.
        Needs a sandbox that takes new inputs, as a pool's does; returns the inputs added."""
        more = Inputs.from_paths(paths)
        combined = self.inputs.extended(more)  # InputError: that name is there already
        self.sandbox.add_inputs(more)  # first: one that refuses leaves the session as it was
        self.inputs = combined
        tool = self.registry.get("file_metadata")
        if tool is not None:
            tool.function = file_metadata_tool(combined, self.sandbox).function
        self.loop.describe_inputs(self._described())
        self.publish(InputsAdded(added=more.to_trace()))
        return more

    def interrupt(self) -> None:
        """Interrupt the running cell (the chat's Ctrl-C); the question goes on with the error."""
        self.sandbox.interrupt()

    def reset(self) -> None:
        """A fresh kernel and an empty history (workspace files are kept); recorded in the
        trace, so a replay resets at the same point."""
        if self.sandbox_used:
            self.sandbox.restart()
        self.loop.reset()
        self.publish(Reset(question=self.loop.questions))

    def start_over(self) -> None:
        """A clean slate for another attempt at the same job (the next recipe, or the agent
        after them): the sandbox renewed (no process, file or variable of the last attempt
        left, the same inputs), an empty history; recorded, so a recipe made from this trace
        keeps only the cells after it."""
        if self.sandbox_used:
            self.sandbox.renew(self.inputs)
        self.loop.reset()
        self.publish(Reset(question=self.loop.questions, reason=ATTEMPT))

    def executed(self, code: str, execution: Execution) -> None:
        """A cell run without the model (serve's /execute): recorded as a step, so the
        notebook and replay hold it."""
        for event in cell_events(self.loop.questions, code, execution):
            self.publish(event)

    @property
    def messages(self) -> list[dict]:
        return self.loop.messages

    def close(self) -> None:
        try:
            if isinstance(self.sandbox, BackgroundSandbox) and not self.sandbox.used:
                self.publish(SandboxReady(**self.sandbox.timing(), used=False))
        finally:
            self.trace.close()
            if self.hand_back is not None and self.sandbox_used:
                self.hand_back(self._inner_sandbox())  # closes it when it cannot take it
            else:
                self.sandbox.close()

    def pause(self, reason: str) -> SandboxPaused:
        """Checkpoint the kernel into the session folder's PAUSED_DIR and remove its
        container (gVisor; `sandcell chat --resume` continues it); PauseError says why not
        (then the sandbox runs on, unless the error says it ended)."""
        if not self.sandbox_used:
            raise checkpoint.PauseError("no code ran in this session: there is no kernel to keep")
        sandbox = self._inner_sandbox()
        if not isinstance(sandbox, DockerSandbox):
            raise checkpoint.PauseError("only a Docker sandbox can be paused")
        began, folder = time.monotonic(), self.folder / PAUSED_DIR
        sandbox.pause(folder)
        paused = SandboxPaused(reason, round(time.monotonic() - began, 2), checkpoint.size(folder))
        self.publish(paused)
        return paused

    def _inner_sandbox(self) -> Sandbox:
        if isinstance(self.sandbox, BackgroundSandbox):
            return self.sandbox.ready()
        return self.sandbox

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_sandbox(given: object) -> TypeGuard[Sandbox]:
    """A sandbox given itself, not a function that makes one: a factory is called, a sandbox
    is not (a sandbox of the caller's own need not be a complete `Sandbox` to be one)."""
    return given is not None and (isinstance(given, Sandbox) or not callable(given))
