"""A sandbox a session keeps for its whole life, though a server releases its container
while the session idles.

A `Session` holds one sandbox from its start to its end, but a server must give an idle
session's container back and start another when the session is used again. This wraps the
usual `BackgroundSandbox` over the server's pool: it releases the container on request and
begins a fresh one (same inputs, and the files brought back before, put back in place) on
the next use. The kernel's variables do not survive a release; the caller says so. Under
gVisor it can pause instead (the container checkpointed into a folder, then removed): the
next use resumes the kernel as it was, or starts a fresh one when the restore fails."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sandcell.sandbox import checkpoint
from sandcell.sandbox.background import BackgroundSandbox, Forwarder, OnReady
from sandcell.sandbox.errors import SandboxError, SandboxUnavailable
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.limits import Limits
from sandcell.sandbox.protocol import Sandbox

Acquire = Callable[[Inputs], Sandbox]  # e.g. a pool's acquire
Resume = Callable[[Path, Inputs], Sandbox]  # e.g. a pool's resume: the sandbox paused there
Prepare = Callable[[Sandbox], None]  # run on a renewed sandbox before anything uses it
# run on what an export brought to host_dir (the names given), before anyone moves it; it may
# refuse it with a SandboxError
CheckExport = Callable[[Path, list[str]], None]


class ResumeAttempt:
    """The restore a wake() began from a paused sandbox: wait() for its outcome."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: str | None = None  # why it was not restored (a fresh sandbox starts)
        self.kept = False  # nothing was tried (no engine, image or runtime): tried again later
        self.seconds = 0.0

    def finish(self, began: float, error: BaseException | None) -> None:
        self.seconds = round(time.monotonic() - began, 2)
        self.error = None if error is None else str(error) or type(error).__name__
        self._done.set()

    def wait(self) -> str | None:
        """None once the kernel is back, else why not (each path of the start ends it)."""
        self._done.wait()
        return self.error


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
        resume: Resume | None = None,
        paused: Path | None = None,
    ):
        self.limits, self.inputs = limits, inputs
        self._acquire, self._prepare, self.on_ready = acquire, prepare, on_ready
        self._check_export, self._resume = check_export, resume
        # the folder a pause() left (or a server before a restart): the next wake restores it
        self.paused = paused if resume is not None else None
        self.resuming: ResumeAttempt | None = None  # the latest wake's restore, if it tried one
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
            renewed, inputs, paused = self._released, self.inputs, self.paused
            self.paused = None  # tried once: a failed restore would fail again
            attempt = self.resuming = ResumeAttempt() if paused is not None else None

            def start() -> Sandbox:
                if paused is not None and attempt is not None:
                    resumed = self._restored(paused, inputs, attempt)
                    if resumed is not None:
                        return resumed
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

    def _restored(self, folder: Path, inputs: Inputs, attempt: ResumeAttempt) -> Sandbox | None:
        """The sandbox paused into `folder`, restored with the inputs it had (those added
        since go in after); None when it cannot be (`attempt` says why). The folder is
        removed either way: the kernel moves on from it, or it cannot be used."""
        began = time.monotonic()
        error: Exception | None = None
        sandbox: Sandbox | None = None
        try:
            had = checkpoint.Paused.read(folder).mounts["inputs"]
            assert self._resume is not None
            sandbox = self._resume(folder, Inputs(i for i in inputs if i.name in had))
            added = Inputs(i for i in inputs if i.name not in had)
            if added:
                sandbox.add_inputs(added)
        except SandboxUnavailable as caught:  # a fresh start would fail alike: the use says it
            error, attempt.kept = caught, True
            with self._lock:
                self.paused = folder
            raise
        except Exception as caught:  # any other failure: a fresh sandbox (the caller's fallback)
            error = caught
            if sandbox is not None:
                sandbox.close()
            sandbox = None
        finally:
            if not attempt.kept:
                shutil.rmtree(folder, ignore_errors=True)
            attempt.finish(began, error)
        return sandbox

    def pause(self, folder: Path) -> None:
        """Checkpoint the running sandbox into `folder` and remove its container; the next
        use resumes it. PauseError (or SandboxError) when it cannot be: the sandbox runs on,
        unless the error says it ended (the caller then releases it)."""
        with self._lock:
            current = self._current
            if self._closed:
                raise checkpoint.PauseError("the session's sandbox was closed before its pause")
            if current is None or not current.used or self._resume is None:
                raise checkpoint.PauseError("no sandbox has run code here: nothing to keep")
            sandbox = current.ready()
        pause = getattr(sandbox, "pause", None)
        if pause is None:
            raise checkpoint.PauseError("this kind of sandbox cannot be paused")
        # not under the lock: close() (a server stopping past its bound) must not wait for it
        pause(folder)
        with self._lock:
            if self._current is current:
                self._current, self._released, self.paused = None, True, folder
                return
        shutil.rmtree(folder, ignore_errors=True)  # released meanwhile: nothing resumes it
        raise checkpoint.PauseError("the session was closed while its sandbox paused")

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
    def node(self) -> str | None:
        """The Ray node holding the live sandbox (None without --ray, or with no container)."""
        current = self._current
        return current.node if current is not None and self.live else None

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
