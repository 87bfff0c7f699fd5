"""A warm pool: sandboxes started ahead of time, handed out and refilled in the background.
A sandbox is never reused by a second session; a batch worker may give one back with
release() once its job is over, and the pool hands it out again only renewed (see
DockerSandbox.renew): no process, file, input or kernel state of the last job is left.
The renewal runs in the background while the worker goes on to its next job (in another
sandbox), and a renewed sandbox is handed out before a fresh one."""

import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from sandcell.sandbox.docker_sandbox import DockerSandbox
from sandcell.sandbox.errors import SandboxError
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.limits import Limits

RETRY_AFTER_S = 5.0  # after a failed background start
# A renewal under way is waited for this long at most (it takes a fraction of a second; one
# that hangs on a stuck engine must not hold a job longer than starting a sandbox would)
RENEWAL_WAIT_S = 10.0

# Loaded while the sandbox waits in the pool, so a job's first `import pandas` is instant.
# __import__ binds no name: the user's namespace stays empty.
WARMUP = "__import__('pandas'); __import__('numpy'); __import__('matplotlib.pyplot')"


# gVisor's runsc (2022-12) lists no System V IPC objects (no /proc/sysvipc, no SHM_INFO), so
# a renewal cannot remove a shared memory segment or queue a job left for the next one.
NOT_UNDER_GVISOR = (
    "a gVisor sandbox is not renewed: System V IPC objects a job made cannot be found and "
    "removed there; each job gets a fresh sandbox"
)


def warmed(sandbox: DockerSandbox, code: str | None = WARMUP) -> DockerSandbox:
    """The sandbox after its warm-up cell (a failed warm-up only costs time later)."""
    if code:
        try:
            sandbox.run(code)
        except BaseException:  # re-raised: a sandbox that failed here must not be left running
            sandbox.close()
            raise
    return sandbox


class SandboxPool:
    def __init__(
        self,
        size: int = 2,
        limits: Limits | None = None,
        image: str | None = None,
        warmup: str | None = WARMUP,
    ):
        self.size, self.warmup = size, warmup
        self.limits = limits or Limits()
        self.image = image
        self._changed = threading.Condition()  # guards the fields below; told of each change
        self._ready: deque[DockerSandbox] = deque()  # started in the background
        self._renewed: deque[DockerSandbox] = deque()  # given back and renewed: handed out first
        self._renewing = 0  # given back, being renewed
        # ready + starting + renewed + renewing: a sandbox is started only to keep this at size
        # (one being renewed will be ready in a fraction of a start)
        self._idle = size
        self.renew_error: Exception | None = None  # why the latest renewal failed
        self._wanted = threading.Semaphore(0)  # one permit per sandbox to start
        self._closed = threading.Event()
        # The latest background start's failure, None once a start succeeds: an engine
        # outage leaves one error, not one per worker per retry, and none after it ends.
        self.error: Exception | None = None
        self._workers = [
            threading.Thread(target=self._fill, daemon=True, name=f"pool-{i}")
            for i in range(max(1, min(size, 4)))
        ]
        for _ in range(size):
            self._wanted.release()
        for worker in self._workers:
            worker.start()

    def _new(self) -> DockerSandbox:
        return warmed(
            DockerSandbox(limits=self.limits, image=self.image, staging=True), self.warmup
        )

    def _fill(self) -> None:
        while True:
            self._wanted.acquire()
            if self._closed.is_set():
                return
            try:
                sandbox = self._new()
            except Exception as error:  # kept: acquire() then starts one itself, and says
                self.error = error
                if not self._closed.wait(RETRY_AFTER_S):
                    self._wanted.release()  # try the slot again later: the pool keeps its size
                continue
            self.error = None
            with self._changed:
                kept = not self._closed.is_set()
                if kept:
                    self._ready.append(sandbox)
                    self._changed.notify_all()
            if not kept:
                sandbox.close()
                return

    def _taken(self) -> None:
        """One idle sandbox fewer (handed out, or its renewal failed): start one if the pool
        is below its size. Called holding self._changed."""
        self._idle -= 1
        if self._idle < self.size and not self._closed.is_set():
            self._idle += 1
            self._wanted.release()

    def acquire(
        self,
        inputs: Inputs | Sequence[str | Path] = (),
        timeout: float | None = None,
        *,
        allow_net: Sequence[str] | None = None,
    ) -> DockerSandbox:
        """A fresh sandbox with `inputs` under /data; starts one now if none is ready (a
        renewal under way is waited for; a background start only up to `timeout`).
        `allow_net`: its network narrowed to those entries (DockerSandbox.narrow_net); None:
        the pool's whole --allow-net."""
        # While background starts fail, waiting for one is pointless: a start here raises
        # the engine's error as it is now (or works, the outage over), never a stale one.
        now = time.monotonic()
        until = now + (timeout if self.error is None and timeout else 0.0)
        renewal_until = max(until, now + RENEWAL_WAIT_S)
        sandbox = None
        with self._changed:
            while sandbox is None:
                if self._closed.is_set():
                    raise RuntimeError("this pool is closed")
                left = (renewal_until if self._renewing else until) - time.monotonic()
                if self._renewed or self._ready:
                    sandbox = (self._renewed or self._ready).popleft()
                    self._taken()
                elif left > 0:
                    self._changed.wait(left)
                else:
                    break
        if sandbox is None:
            sandbox = self._new()
            self.error = None
        try:
            sandbox.narrow_net(allow_net)  # a renewed one may have been narrowed for another
            if inputs:
                sandbox.add_inputs(inputs)
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    def resume(self, folder: Path, inputs: Inputs) -> DockerSandbox:
        """The sandbox paused into `folder` (DockerSandbox.pause), restored with this pool's
        limits and image, `inputs` (those it had) in its staging folder: PauseError when it
        cannot be (nothing is left running)."""
        return DockerSandbox(
            limits=self.limits, inputs=inputs, image=self.image, staging=True, resume_from=folder
        )

    def release(self, sandbox: DockerSandbox) -> bool:
        """Give back a sandbox whose job is over, for a later acquire() (batch workers running
        job after job): it is renewed in the background, and handed out again only once
        renewed; one that cannot be renewed is closed (`renew_error` says why). False when
        it is closed at once: it runs under gVisor (see NOT_UNDER_GVISOR) or the pool is
        closed. Only for a sandbox this pool handed out, after code that a check then judged
        (a recipe); one in which the model's agent ran, close() instead: renewal holds
        against any code, but that is the sandbox model code had longest to work on."""
        if sandbox.gvisor:
            self.renew_error = SandboxError(NOT_UNDER_GVISOR)
        with self._changed:
            keep = not self._closed.is_set() and not sandbox.gvisor
            if keep:
                self._renewing += 1
                self._idle += 1
        if not keep:
            sandbox.close()
            return False
        try:
            threading.Thread(
                target=self._renew, args=(sandbox,), daemon=True, name="pool-renew"
            ).start()
        except BaseException:  # re-raised (no thread to be had): the renewal never began
            self._renewal_ended(sandbox, renewed=False)
            raise
        return True

    def _renew(self, sandbox: DockerSandbox) -> None:
        renewed = False
        try:
            if not self._closed.is_set():  # the pool's end: a renewal would be thrown away
                sandbox.renew()
                renewed = True
        except Exception as error:  # renew() closed it (a SandboxError); any other: close it
            self.renew_error = error
        finally:
            self._renewal_ended(sandbox, renewed)

    def _renewal_ended(self, sandbox: DockerSandbox, renewed: bool) -> None:
        """Keep the sandbox for acquire() if it was renewed (and the pool is open), else close
        it; then count the renewal as over (close() waits for that)."""
        try:
            with self._changed:
                kept = renewed and not self._closed.is_set()
                if kept:
                    self._renewed.append(sandbox)
            if not kept:
                sandbox.close()
        finally:
            with self._changed:
                self._renewing -= 1
                if not renewed:
                    self._taken()
                self._changed.notify_all()

    def ready(self) -> int:
        """Sandboxes ready to hand out now (renewed or started)."""
        with self._changed:
            return len(self._ready) + len(self._renewed)

    def close(self) -> None:
        with self._changed:
            self._closed.set()
            self._changed.notify_all()
        for _ in self._workers:
            self._wanted.release()
        for worker in self._workers:
            worker.join(timeout=120)
        with self._changed:  # a renewal under way closes its sandbox itself (see _renew)
            self._changed.wait_for(lambda: not self._renewing, timeout=60)
            kept = [*self._ready, *self._renewed]
            self._ready.clear()
            self._renewed.clear()
        for sandbox in kept:
            sandbox.close()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
