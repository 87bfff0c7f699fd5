"""The Python API: `Agent(model=..., limits=...).run(task, inputs=[...]) -> Result`, and
`agent.session(inputs=[...])` for several questions sharing one sandbox (kernel state, files,
history). Each question leaves trace.jsonl and notebook.ipynb up to date in the session folder,
and the files the code wrote under /workspace/output copied to <folder>/output."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Self

from agent.loop import Loop, OnEvent
from agent.notebook import export_notebook
from agent.prompts import inputs_profile
from agent.seams import Model, Result
from agent.stops import Rules
from agent.trace import TraceWriter
from sandbox import DockerSandbox, Limits, SandboxError
from tools import Registry, Tool, calculator_tool
from tools.file_metadata import file_metadata_tool
from tools.python import python_tool

OUTPUT_DIR = "output"  # /workspace/output: what a job hands back
PREPARE = "import os as _os; _os.makedirs('/workspace/output', exist_ok=True); del _os"


def prepare(sandbox: DockerSandbox) -> None:
    """What every session's kernel starts with (replays too): the output folder exists."""
    execution = sandbox.run(PREPARE)
    if not execution.ok:
        raise SandboxError(f"preparing the sandbox failed: {execution.error}")


class Agent:
    def __init__(
        self,
        model: Model,
        *,
        limits: Limits | None = None,
        rules: Rules | None = None,
        protocol: str = "auto",
        image: str | None = None,
        extra_tools: list[Tool] | None = None,
        on_event: OnEvent | None = None,
    ):
        self.model, self.limits, self.rules = model, limits or Limits(), rules or Rules()
        self.protocol, self.image, self.on_event = protocol, image, on_event
        self.extra_tools = list(extra_tools or [])

    def run(
        self, task: str, inputs: list[str | Path] = (), output_dir: str | Path | None = None
    ) -> Result:
        """Answer one task in a fresh sandbox, then close it."""
        with self.session(inputs, output_dir) as session:
            return session.ask(task)

    def session(
        self,
        inputs: list[str | Path] = (),
        output_dir: str | Path | None = None,
        sandbox: DockerSandbox | None = None,
    ) -> Session:
        """A conversation in one sandbox. Pass `sandbox` (e.g. from a SandboxPool, with its
        inputs added) to use it; the session then leaves closing it to the caller."""
        return Session(self, list(inputs), output_dir, sandbox)


class Session:
    def __init__(
        self,
        agent: Agent,
        inputs: list[str | Path],
        output_dir: str | Path | None,
        sandbox: DockerSandbox | None,
    ):
        self.agent, self.inputs = agent, [Path(p) for p in inputs]
        self.folder = Path(output_dir or tempfile.mkdtemp(prefix="sandcell-session-"))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.trace_path = self.folder / "trace.jsonl"
        self.notebook_path = self.folder / "notebook.ipynb"
        self._owns_sandbox = sandbox is None
        started = time.monotonic()
        self.sandbox = sandbox or DockerSandbox(agent.limits, self.inputs, agent.image)
        self.sandbox_start_s = time.monotonic() - started
        try:
            prepare(self.sandbox)
            self.registry = Registry(
                [
                    python_tool(self.sandbox),
                    calculator_tool,
                    file_metadata_tool(self.inputs, self.sandbox),
                    *agent.extra_tools,
                ]
            )
            self.trace = TraceWriter(self.trace_path)
            self.loop = Loop(
                agent.model,
                self.registry,
                self.trace,
                protocol=agent.protocol,
                rules=agent.rules,
                inputs_profile=inputs_profile(self.inputs),
                on_event=agent.on_event,
            )
        except BaseException:  # re-raised: only the container must not outlive the failure
            if self._owns_sandbox:
                self.sandbox.close()
            raise
        self.trace.write(
            "session",
            model=getattr(agent.model, "name", type(agent.model).__name__),
            protocol=agent.protocol,
            inputs=[str(p) for p in self.inputs],
            image=getattr(self.sandbox, "image", None),
            limits=agent.limits.to_dict(),
            rules=vars(agent.rules),
            sandbox_start_s=round(self.sandbox_start_s, 3),
        )

    def ask(self, question: str) -> Result:
        result = self.loop.ask(question)
        result.trace_path = self.trace_path
        result.notebook_path = export_notebook(self.trace_path, self.notebook_path)
        try:
            result.files = self.export(self.folder / OUTPUT_DIR)
        except SandboxError as exc:  # a dead container must not hide the answer
            self.trace.write("export_failed", error=str(exc))
            result.warnings.append(
                f"the files under /workspace/{OUTPUT_DIR} were not copied: {exc}"
            )
        return result

    def export(self, host_dir: str | Path) -> list[str]:
        """Copy what the code wrote under /workspace/output to host_dir; the host paths."""
        copied = self.sandbox.export(host_dir, OUTPUT_DIR)
        return [str(Path(host_dir) / name) for name in copied]

    def files(self) -> list[dict]:
        return self.sandbox.files()

    def interrupt(self) -> None:
        """Interrupt the running cell (the chat's Ctrl-C); the question goes on with the error."""
        self.sandbox.interrupt()

    @property
    def messages(self) -> list[dict]:
        return self.loop.messages

    def close(self) -> None:
        self.trace.close()
        if self._owns_sandbox:
            self.sandbox.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
