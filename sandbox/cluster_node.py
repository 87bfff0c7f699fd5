"""The node's side of sandboxes on a Ray cluster (sandbox/cluster.py is the server's): one
`SandboxNode` actor per node holds the DockerSandboxes a server placed there, by handle, and
the node's warm pool. A sandbox's kernel connection lives in the process that started it, and
the pool must hand its sandboxes to that same process: hence one actor per node, not one per
sandbox. Bytes come and go in objects of at most CHUNK."""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray

from sandcell.sandbox import checkpoint
from sandcell.sandbox import container as ctr
from sandcell.sandbox.docker_sandbox import DockerSandbox
from sandcell.sandbox.errors import SandboxError
from sandcell.sandbox.execution import Execution, StreamChunk
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.limits import Limits
from sandcell.sandbox.pool import SandboxPool
from sandcell.sandbox.wheelhouse import on_this_machine

SCRATCH = "sandcell-node"  # the scratch folders' prefix, in the node's temporary folder
CHUNK = 8 << 20  # the most bytes one object through the store holds (a test node's is small)

Chunks = list[ray.ObjectRef[bytes]]


def in_chunks(data: bytes) -> Iterator[bytes]:
    for at in range(0, max(1, len(data)), CHUNK):
        yield data[at : at + CHUNK]


def scratch_root() -> Path:
    """This actor's folder for its sandboxes' scratch folders, named by its pid; those of actors
    whose process is gone (a worker that died, a node lost and back) removed first."""
    for old in Path(tempfile.gettempdir()).glob(f"{SCRATCH}-*"):
        pid = old.name.removeprefix(f"{SCRATCH}-").split("-")[0]
        if pid.isdigit() and not ctr.alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH}-{os.getpid()}-"))


class SandboxNode:
    """One per node: its warm pool and the server's sandboxes on it, by handle."""

    def __init__(self, pool_size: int, limits: Limits, image: str | None):
        # each node mounts its own wheelhouse: the server's folder when this node has it
        self.limits = replace(limits, wheelhouse=on_this_machine(limits.wheelhouse))
        self.image = image
        self.reap()  # the containers an earlier actor of this node left (its worker died)
        self._root = scratch_root()
        self.pool = SandboxPool(pool_size, self.limits, image) if pool_size else None
        self._sandboxes: dict[str, DockerSandbox] = {}
        self._scratch: dict[str, Path] = {}  # each sandbox's inputs, written here
        self._lock = threading.Lock()
        self._numbers = itertools.count()  # input files' names in the scratch folders

    def _sandbox(self, handle: str) -> DockerSandbox:
        sandbox = self._sandboxes.get(handle)
        if sandbox is None:
            raise SandboxError("this sandbox is closed; start a new session")
        return sandbox

    def _inputs(self, handle: str, shipped: dict[str, Chunks]) -> Inputs:
        """The files the server sent, written read-only into the sandbox's scratch folder."""
        folder = self._scratch[handle]
        paths = {}
        for name, refs in shipped.items():
            path = folder / f"{next(self._numbers)}-{name}"
            with open(path, "wb") as f:
                for ref in refs:
                    f.write(ray.get(ref))
            path.chmod(0o444)
            paths[name] = path
        return Inputs.from_paths(paths)

    def _begin(self, handle: str) -> Path:
        """The sandbox's scratch folder on this node (its inputs, a pause on its way)."""
        with self._lock:
            if handle not in self._scratch:
                self._scratch[handle] = Path(tempfile.mkdtemp(dir=self._root))
            return self._scratch[handle]

    def acquire(
        self, handle: str, shipped: dict[str, Chunks], allow_net: tuple[str, ...] | None = None
    ) -> str:
        """A sandbox for `handle` with these inputs (its network narrowed to `allow_net`);
        this node's id."""
        self._begin(handle)
        inputs = self._inputs(handle, shipped)
        if self.pool is not None:
            sandbox = self.pool.acquire(inputs, allow_net=allow_net)
        else:
            sandbox = DockerSandbox(limits=self.limits, image=self.image, staging=True)
            try:
                if allow_net is not None:
                    sandbox.narrow_net(allow_net)
                sandbox.add_inputs(inputs)
            except BaseException:
                sandbox.close()
                raise
        with self._lock:
            self._sandboxes[handle] = sandbox
        return ray.get_runtime_context().get_node_id()

    def run(self, handle: str, code: str, timeout: float | None) -> Iterator[object]:
        """Each output chunk as it comes, then the Execution (a Ray generator)."""
        sandbox = self._sandbox(handle)
        chunks: queue.Queue[StreamChunk | None] = queue.Queue()
        ended: list[Execution | BaseException] = []

        def cell() -> None:
            try:
                ended.append(sandbox.run(code, timeout, on_output=chunks.put))
            except BaseException as error:  # raised to the server below
                ended.append(error)
            finally:
                chunks.put(None)

        threading.Thread(target=cell, daemon=True, name=f"cell-{handle}").start()
        while (chunk := chunks.get()) is not None:
            yield chunk
        if isinstance(ended[0], BaseException):
            raise ended[0]
        yield ended[0]

    def call(self, handle: str, method: str, *args: Any) -> Any:
        """interrupt, restart, stat, files, run_checks, and run when the caller does not read
        the output as it comes (one answer, no generator): as the sandbox answers them."""
        if method not in ("run", "interrupt", "restart", "stat", "files", "run_checks"):
            raise SandboxError(f"no such sandbox call: {method}")
        return getattr(self._sandbox(handle), method)(*args)

    def read(self, handle: str, path: str, max_bytes: int | None) -> Iterator[bytes]:
        yield from in_chunks(self._sandbox(handle).read(path, max_bytes))

    def write(self, handle: str, path: str, refs: Chunks) -> None:
        self._sandbox(handle).write(path, b"".join(ray.get(ref) for ref in refs))

    def archive(self, handle: str, subdir: str) -> Iterator[bytes]:
        """The workspace's tar (hostile: the server unpacks it as a local export does)."""
        archive = self._sandbox(handle).archive(subdir)
        if archive is not None:
            yield from in_chunks(archive)

    def add_inputs(self, handle: str, shipped: dict[str, Chunks]) -> None:
        self._sandbox(handle).add_inputs(self._inputs(handle, shipped))

    def renew(self, handle: str, shipped: dict[str, Chunks]) -> None:
        self._sandbox(handle).renew(self._inputs(handle, shipped))

    def close(self, handle: str) -> None:
        with self._lock:
            sandbox = self._sandboxes.pop(handle, None)
            scratch = self._scratch.pop(handle, None)
        try:
            if sandbox is not None:
                sandbox.close()
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def pause(self, handle: str) -> Iterator[bytes]:
        """The sandbox paused (gVisor) and its container removed: the tar of its pause, read
        back a chunk at a time, without this node's seal (the server seals it with its own).
        PauseError as a local pause's: the sandbox runs on unless it says it ended."""
        folder = self._begin(handle) / "paused"
        self._sandbox(handle).pause(folder)
        archive = folder.with_suffix(".tar")
        try:
            with tarfile.open(archive, "w") as tar:
                tar.add(folder / checkpoint.STATE, arcname=checkpoint.STATE)
                tar.add(folder / checkpoint.SAVED, arcname=checkpoint.SAVED)
            shutil.rmtree(folder)
            with open(archive, "rb") as f:  # a plain loop: Ray sends into the generator
                while chunk := f.read(CHUNK):
                    yield chunk
        finally:
            self.close(handle)  # the scratch folder with it

    def receive(self, handle: str, chunk: bytes) -> None:
        """One chunk of a pause to resume here, appended (sent as an object of the store, which
        Ray hands over as its bytes: one at a time)."""
        with open(self._begin(handle) / "paused.tar", "ab") as f:
            f.write(chunk)

    def resume(self, handle: str, shipped: dict[str, Chunks]) -> str:
        """The sandbox paused elsewhere (its tar received), sealed with this node's key once
        the server checked its own, restored with these inputs (those it had); this node's
        id. PauseError when the engine, image, runsc or mounts do not match."""
        scratch = self._begin(handle)
        folder = scratch / "paused"
        try:
            with tarfile.open(scratch / "paused.tar", "r:") as tar:
                tar.extractall(folder, filter="data")
            (scratch / "paused.tar").unlink()
            checkpoint.seal(folder)
            inputs = self._inputs(handle, shipped)
            sandbox = DockerSandbox(
                limits=self.limits, inputs=inputs, image=self.image, staging=True,
                resume_from=folder,
            )  # fmt: skip
        except BaseException:
            self.close(handle)
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        with self._lock:
            self._sandboxes[handle] = sandbox
        return ray.get_runtime_context().get_node_id()

    def reap(self) -> int:
        """Containers of this engine whose owner process on this host is gone (a node lost
        on a machine it shared with this one: the test cluster), removed."""
        return len(ctr.reap_orphans(ctr.engine(), wait_s=ctr.REMOVAL_WAIT_S))

    def ping(self) -> bool:
        return True

    def shutdown(self) -> None:
        """Every sandbox of this node removed, and its pool (the server is stopping)."""
        for handle in list(self._sandboxes):
            self.close(handle)
        if self.pool is not None:
            self.pool.close()
        shutil.rmtree(self._root, ignore_errors=True)
