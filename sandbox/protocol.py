"""The Sandbox seam: what `tools.python`, `Session`, the pool and the front ends use to run
code and move files. `DockerSandbox` is the sandbox; `BackgroundSandbox` is one that is still
starting; `RenewableSandbox` one a server may release while its session idles. Nothing here
imports Docker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from sandcell.sandbox.execution import Execution, StreamChunk
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.limits import Limits


@runtime_checkable
class Sandbox(Protocol):
    limits: Limits
    inputs: Inputs  # mounted read-only under /data

    def run(
        self,
        code: str,
        timeout: float | None = None,
        *,
        on_output: Callable[[StreamChunk], None] | None = None,  # each stdout/stderr chunk
    ) -> Execution: ...

    def interrupt(self) -> None: ...  # KeyboardInterrupt in the running cell; state kept

    def restart(self) -> None: ...  # a fresh kernel; workspace files kept

    def stat(self, path: str) -> dict: ...  # {"path", "kind", "size", "mtime"}

    def read(self, path: str, max_bytes: int | None = None) -> bytes: ...

    def write(self, path: str, data: bytes) -> None: ...

    def files(self) -> list[dict]: ...  # the workspace's files: path, size, mtime

    def export(self, host_dir: str | Path, subdir: str = "") -> list[str]: ...

    # more files under /data, read-only (a pool's sandbox takes them; one started with its
    # inputs fixed refuses them with a SandboxError)
    def add_inputs(self, more: Inputs) -> None: ...

    # declared checks on /workspace files, in a fresh `python -I` of the image's checker
    # (images/checks.py): the request and answer are agent.output_checks'
    def run_checks(self, request: dict) -> dict: ...

    # made what a fresh sandbox would be, in the same container (another attempt at a job):
    # every process killed, the workspace, /tmp and shared memory emptied, a fresh kernel,
    # /data holding exactly `inputs` (a pool's sandbox can; others raise SandboxError)
    def renew(self, inputs: Inputs) -> None: ...

    def close(self) -> None: ...


class Pool(Protocol):
    """Where a server's sessions take their sandboxes: `SandboxPool` on this host's engine,
    or `cluster.RayPool` on a Ray cluster's nodes."""

    # `allow_net`: only those of these entries its --allow-net covers, until it is renewed (a
    # serve user's allow-net= in --users)
    def acquire(
        self, inputs: Inputs = ..., *, allow_net: Sequence[str] | None = ...
    ) -> Sandbox: ...

    # the sandbox paused into `folder`, restored with `inputs` (PauseError when it cannot be)
    def resume(self, folder: Path, inputs: Inputs) -> Sandbox: ...

    def close(self) -> None: ...
