"""A warm pool: sandboxes started ahead of time, handed out and refilled in the background.
A sandbox is never reused by a second session; a batch worker may give one back with
release() once its job is over, and the pool hands it out again only renewed (see
DockerSandbox.renew): no process, file, input or kernel state of the last job is left."""

import queue
import threading
from pathlib import Path

from sandbox.docker_sandbox import DockerSandbox
from sandbox.errors import SandboxError
from sandbox.inputs import Inputs
from sandbox.limits import Limits

RETRY_AFTER_S = 5.0  # after a failed background start

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
        self._ready: queue.Queue[DockerSandbox] = queue.Queue()
        # given back by release(), renewed: handed out before fresh ones, and without a refill
        self._renewed: queue.Queue[DockerSandbox] = queue.Queue()
        self.renew_error: Exception | None = None  # why the latest release() could not renew
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
            if self._closed.is_set():
                sandbox.close()
                return
            self._ready.put(sandbox)

    def acquire(
        self, inputs: Inputs | list[str | Path] = (), timeout: float | None = None
    ) -> DockerSandbox:
        """A fresh sandbox with `inputs` under /data; starts one now if none is ready."""
        if self._closed.is_set():
            raise RuntimeError("this pool is closed")
        # While background starts fail, waiting for one is pointless: a start here raises
        # the engine's error as it is now (or works, the outage over), never a stale one.
        wait = timeout if self.error is None else None
        try:
            sandbox = self._renewed.get_nowait()
        except queue.Empty:
            try:
                sandbox = self._ready.get(timeout=wait) if wait else self._ready.get_nowait()
            except queue.Empty:
                sandbox = self._new()
                self.error = None
            else:
                self._wanted.release()  # refill the slot just taken
        if inputs:
            try:
                sandbox.add_inputs(inputs)
            except BaseException:
                sandbox.close()
                raise
        return sandbox

    def release(self, sandbox: DockerSandbox) -> bool:
        """Give back a sandbox whose job is over, for a later acquire() (batch workers running
        job after job): it is renewed now, so nothing of the job outlives this call, and kept.
        False if it could not be renewed (it is closed; `renew_error` says why), runs under
        gVisor (see NOT_UNDER_GVISOR) or the pool is closed. Only for a sandbox this pool handed out, after code that a check then
        judged (a recipe); one in which the model's agent ran, close() instead: renewal holds
        against any code, but that is the sandbox model code had longest to work on."""
        if self._closed.is_set():
            sandbox.close()
            return False
        if sandbox.gvisor:
            sandbox.close()
            self.renew_error = SandboxError(NOT_UNDER_GVISOR)
            return False
        try:
            sandbox.renew()
        except Exception as error:  # renew() closed it (a SandboxError); any other: close it
            sandbox.close()
            self.renew_error = error
            return False
        self._renewed.put(sandbox)
        if self._closed.is_set():  # closed meanwhile: close() may have emptied the queue
            while not self._renewed.empty():
                self._renewed.get_nowait().close()
            return False
        return True

    def ready(self) -> int:
        return self._ready.qsize()

    def close(self) -> None:
        self._closed.set()
        for _ in self._workers:
            self._wanted.release()
        for worker in self._workers:
            worker.join(timeout=120)
        for waiting in (self._ready, self._renewed):
            while not waiting.empty():
                waiting.get_nowait().close()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
