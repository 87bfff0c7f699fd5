"""A sandbox that starts in a background thread and is waited for only when first used.

A session creates one as it starts, so the container start (about a second) overlaps the first
model request; a question answered without code never waits for it, and a session that ends
before anything used it never keeps a container (or, started on demand, never starts one)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandcell.sandbox.errors import SandboxError
from sandcell.sandbox.execution import Execution, StreamChunk
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.limits import Limits
from sandcell.sandbox.protocol import Sandbox

OnReady = Callable[[dict], None]  # timing(); with "error" when the start failed


class Forwarder:
    """The Sandbox seam forwarded to the sandbox `_target()` gives (a wrapper's inner one,
    started or woken as the wrapper sees fit); interrupt and close are the wrapper's own."""

    def _target(self) -> Sandbox:
        raise NotImplementedError

    def run(
        self,
        code: str,
        timeout: float | None = None,
        *,
        on_output: Callable[[StreamChunk], None] | None = None,
    ) -> Execution:
        return self._target().run(code, timeout, on_output=on_output)

    def restart(self) -> None:
        self._target().restart()

    def stat(self, path: str) -> dict:
        return self._target().stat(path)

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        return self._target().read(path, max_bytes)

    def write(self, path: str, data: bytes) -> None:
        self._target().write(path, data)

    def files(self) -> list[dict]:
        return self._target().files()

    def export(self, host_dir: str | Path, subdir: str = "") -> list[str]:
        return self._target().export(host_dir, subdir)

    def add_inputs(self, more: Inputs) -> None:
        self._target().add_inputs(more)

    def run_checks(self, request: dict) -> dict:
        return self._target().run_checks(request)

    def renew(self, inputs: Inputs) -> None:
        self._target().renew(inputs)


class BackgroundSandbox(Forwarder):
    """The Sandbox made by `start()`, begun at once (`background=True`) or on first use."""

    def __init__(
        self,
        start: Callable[[], Sandbox],
        limits: Limits,
        inputs: Inputs,
        *,
        background: bool = True,
        on_ready: OnReady | None = None,
    ):
        self.limits, self.inputs = limits, inputs
        self._start, self._on_ready = start, on_ready
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._sandbox: Sandbox | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._used = False
        self.started_at: str | None = None  # when the start began (UTC, ISO 8601)
        self.start_s: float | None = None  # how long the start took
        self.waited_s: float | None = None  # how long the first use waited for it
        if background:
            self.begin()

    def begin(self) -> None:
        """Start the sandbox in the background, once."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self.started_at = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
            self._thread = threading.Thread(target=self._run_start, daemon=True, name="sandbox")
            self._thread.start()

    def _run_start(self) -> None:
        began = time.monotonic()
        try:
            sandbox = self._start()
        except BaseException as error:  # kept and raised to the first caller, never lost
            self._error = error
            return
        finally:
            self.start_s = time.monotonic() - began
        with self._lock:
            if self._closed:  # closed while starting: nothing may outlive the session
                sandbox.close()
                return
            self._sandbox = sandbox

    @property
    def failed(self) -> bool:
        """Whether its start ended in an error (raised to each use): no container is there."""
        return self._error is not None

    @property
    def used(self) -> bool:
        """Whether anything has asked for the sandbox yet."""
        return self._used

    def ready(self) -> Sandbox:
        """The running sandbox; waits for (or begins) its start the first time."""
        sandbox = self._sandbox
        if self._used and sandbox is not None:
            return sandbox
        if self._closed:
            raise SandboxError("this sandbox is closed; start a new one")
        self.begin()
        waiting = time.monotonic()
        assert self._thread is not None
        self._thread.join()
        with self._lock:
            first, self._used = not self._used, True
        if first:
            self.waited_s = time.monotonic() - waiting
        if self._error is not None:
            if first and self._on_ready is not None:  # said once, as a ready one is
                self._on_ready({**self.timing(), "error": str(self._error)[:500]})
            raise self._error
        if self._sandbox is None:
            raise SandboxError("this sandbox is closed; start a new one")
        if first and self._on_ready is not None:
            self._on_ready(self.timing())
        return self._sandbox

    def timing(self) -> dict:
        """For the trace: when the start began, how long it took, how long a caller waited,
        and the Ray node it is on (sandbox/cluster.py; None on this host's engine)."""
        return {
            "started_at": self.started_at,
            "start_s": None if self.start_s is None else round(self.start_s, 3),
            "waited_s": None if self.waited_s is None else round(self.waited_s, 3),
            "node": self.node,
        }

    @property
    def node(self) -> str | None:
        """The Ray node the started sandbox is on (None: not started, or this host's)."""
        return getattr(self._sandbox, "node", None)

    # -- the Sandbox seam: each call waits for the start (Forwarder) ---------------------------
    _target = ready

    def interrupt(self) -> None:
        if self._sandbox is not None:  # nothing runs before the start finished
            self._sandbox.interrupt()

    def close(self) -> None:
        """Close the sandbox; one still starting is waited for, then closed, so nothing
        outlives the session."""
        with self._lock:
            self._closed = True
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()
