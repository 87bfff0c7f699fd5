"""A sandbox a session keeps for its whole life, though a server releases its container
while the session idles.

A `Session` holds one sandbox from its start to its end, but a server must give an idle
session's container back and start another when the session is used again. This wraps the
usual `BackgroundSandbox` over the server's pool: it releases the container on request and
begins a fresh one (same inputs, and the files brought back before, put back in place) on
the next use. The kernel's variables do not survive a release; the caller says so."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from sandbox.background import BackgroundSandbox, Forwarder, OnReady
from sandbox.errors import SandboxError
from sandbox.inputs import Inputs
from sandbox.limits import Limits
from sandbox.protocol import Sandbox

Acquire = Callable[[Inputs], Sandbox]  # e.g. a pool's acquire
Prepare = Callable[[Sandbox], None]  # run on a renewed sandbox before anything uses it
# run on what an export brought to host_dir (the names given), before anyone moves it; it may
# refuse it with a SandboxError
CheckExport = Callable[[Path, list[str]], None]


class RenewableSandbox(Forwarder):
    def __init__(
        self,
        acquire: Acquire,
        limits: Limits,
        inputs: Inputs,
        prepare: Prepare | None = None,
        on_ready: OnReady | None = None,
        released: bool = False,
        check_export: CheckExport | None = None,
    ):
        self.limits, self.inputs = limits, inputs
        self._acquire, self._prepare, self.on_ready = acquire, prepare, on_ready
        self._check_export = check_export
        self._lock = threading.RLock()  # an upload, a release and a start never interleave
        self._current: BackgroundSandbox | None = None
        # once released, every sandbox begun is a fresh kernel, `prepare`d; a session resumed
        # after a server restart begins so, with no container until it is used
        self._released = released
        self._closed = False  # closed with its session: nothing may start a container again
        if not released:
            self.wake()

    @property
    def live(self) -> bool:
        """Whether a container is there (or starting): it counts against --max-sessions. One
        whose start failed (the engine was down) is not: the next use begins another."""
        current = self._current
        return current is not None and not current.failed

    def wake(self) -> bool:
        """Begin a sandbox in the background unless one is there; True when it began one
        after a release (the kernel is then a fresh one)."""
        with self._lock:
            if self._closed:
                raise SandboxError("this session is closed; start a new one")
            if self.live:
                return False
            if self._current is not None:  # its start failed: nothing to remove, begin anew
                self._current.close()
            renewed, inputs = self._released, self.inputs

            def start() -> Sandbox:
                sandbox = self._acquire(inputs)
                if renewed and self._prepare is not None:
                    try:
                        self._prepare(sandbox)
                    except BaseException:  # a sandbox that failed here must not be left running
                        sandbox.close()
                        raise
                return sandbox

            self._current = BackgroundSandbox(start, self.limits, inputs, on_ready=self._ready_now)
            return renewed

    def release(self) -> bool:
        """Remove the container; the next use starts a fresh one. False if none was there."""
        with self._lock:
            current = self._current
            self._released = True
            if current is None:
                return False
            try:
                current.close()  # still `live` until the container is gone: it still counts
            finally:  # a removal that failed (the engine gone) must not pin the session
                self._current = None
            return True

    @property
    def used(self) -> bool:
        """Whether the current sandbox has run anything (else its workspace is empty)."""
        current = self._current
        return self.live and current is not None and current.used

    def _ready_now(self, timing: dict) -> None:
        if self.on_ready is not None:
            self.on_ready(timing)

    def _live(self) -> BackgroundSandbox:
        with self._lock:
            self.wake()
            assert self._current is not None
            return self._current

    def add_inputs(self, more: Inputs) -> None:
        """Files for /data: into the running sandbox now, or into the next one started."""
        with self._lock:
            if self._current is not None:
                self._current.add_inputs(more)  # waits for a start under way
            self.inputs = self.inputs.extended(more)

    # -- the Sandbox seam: each call wakes a released sandbox (Forwarder) ---------------------
    _target = _live

    def interrupt(self) -> None:
        current = self._current
        if current is not None:
            current.interrupt()

    def files(self) -> list[dict]:
        return self._live().files() if self.used else []  # nothing ran: nothing there

    def export(self, host_dir: str | Path, subdir: str = "") -> list[str]:
        if not self.used:
            return []  # nothing ran: nothing there
        names = self._live().export(host_dir, subdir)
        if self._check_export is not None:
            self._check_export(Path(host_dir), names)
        return names

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.release()
