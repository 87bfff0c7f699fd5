"""Sandboxes on the nodes of a Ray cluster, for a server (`sandcell serve --ray`).

The server keeps everything but the sandbox; each session's sandbox is a `DockerSandbox` on a
node, held by that node's `SandboxNode` actor (one per node: a sandbox's kernel connection
lives in the process that started it, and the node's warm pool must hand its sandboxes to
that same process). `NodeSandbox` is the server's side: the `Sandbox` Protocol, each call sent
to the actor. A cell's output chunks stream back as they come (a Ray generator); files,
inputs and archives move as bytes in objects of at most CHUNK; an archive from a node is
unpacked on the server by the same hostile-input extraction a local export uses.

`RayPool` is the server's pool: a sandbox goes to the node with the most free `sandcell`
slots (what the node declared, less the sandboxes this server holds there); nodes are used
as they join. Nothing here sees a model, a key or a user's token."""

from __future__ import annotations

import logging
import secrets
import shutil
import signal
import socket
import tarfile
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from sandcell.sandbox import checkpoint
from sandcell.sandbox import container as ctr
from sandcell.sandbox.checkpoint import PauseError
from sandcell.sandbox.cluster_node import CHUNK, Chunks, SandboxNode
from sandcell.sandbox.errors import SandboxError, SandboxUnavailable
from sandcell.sandbox.execution import Execution, StreamChunk
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.limits import Limits

log = logging.getLogger(__name__)
RESOURCE = "sandcell"  # what a node declares: sandboxes at once (as for batches)
SHUTDOWN_S = 120.0  # a node's sandboxes removed at the server's stop, at most
PING_S = 10.0  # a node's actor that does not answer a ping within this is taken as lost


def to_chunks(data: bytes) -> Chunks:
    return [ray.put(data[at : at + CHUNK]) for at in range(0, len(data), CHUNK)] or [ray.put(b"")]


class NodeLost(SandboxError):
    """The Ray node holding a sandbox is gone, and the sandbox with it."""

    def __init__(self, node: str):
        super().__init__(f"the Ray node {node} holding this sandbox was lost")
        self.node = node


class NodeUnavailable(SandboxError):
    """The Ray node holding a sandbox did not answer, for now (it may be going)."""


class NodeSandbox:
    """A session's sandbox on a node, through the `Sandbox` Protocol."""

    def __init__(self, pool: RayPool, node: str, actor: Any, handle: str, inputs: Inputs):
        self.limits, self.inputs = pool.limits, inputs
        self.node, self._pool, self._actor, self._handle = node, pool, actor, handle
        self._closed = False
        self._closing = threading.Lock()  # a pause's own close and a stopping server's

    def _get(self, ref: Any) -> Any:
        """The call's answer; the sandbox's own error as it was raised on the node."""
        try:
            return ray.get(ref)
        except Exception as error:
            raise self._said(error) from None

    def _said(self, error: Exception) -> Exception:
        """A Ray error as the sandbox's: its own error as raised on the node; NodeLost when
        the node's actor died or a result was lost with its node; else a SandboxError."""
        if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, Exception):
            return error.cause
        if isinstance(error, ray.exceptions.ActorDiedError | ray.exceptions.ObjectLostError):
            self._pool.forget(self.node)
            return NodeLost(self.node)
        if isinstance(error, ray.exceptions.RayError):  # unavailable for now: not lost
            first = next(iter(str(error).splitlines()), type(error).__name__)
            return NodeUnavailable(f"the Ray node {self.node} did not answer: {first}")
        return error

    def _stream(self, generator: Any) -> Iterator[Any]:
        try:
            for ref in generator:
                yield self._get(ref)
        except ray.exceptions.RayError as error:
            raise self._said(error) from None

    def run(
        self,
        code: str,
        timeout: float | None = None,
        *,
        on_output: Callable[[StreamChunk], None] | None = None,
    ) -> Execution:
        if on_output is None:  # nobody reads the stream: one answer costs one object
            return self._call("run", code, timeout)
        for item in self._stream(self._actor.run.remote(self._handle, code, timeout)):
            if isinstance(item, Execution):
                return item
            if on_output is not None:
                on_output(item)
        raise SandboxError(f"the cell ended on node {self.node} without its result")

    def _call(self, method: str, *args: Any) -> Any:
        return self._get(self._actor.call.remote(self._handle, method, *args))

    def interrupt(self) -> None:
        self._call("interrupt")

    def restart(self) -> None:
        self._call("restart")

    def stat(self, path: str) -> dict:
        return dict(self._call("stat", path))

    def files(self) -> list[dict]:
        return list(self._call("files"))

    def run_checks(self, request: dict) -> dict:
        return dict(self._call("run_checks", request))

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        cap = max_bytes if max_bytes is not None else self.limits.transfer_bytes
        data = bytearray()
        for chunk in self._stream(self._actor.read.remote(self._handle, path, max_bytes)):
            data += chunk
            if len(data) > cap:  # a node's answer is capped here too
                raise SandboxError(f"{path} came back over {cap} bytes from node {self.node}")
        return bytes(data)

    def write(self, path: str, data: bytes) -> None:
        self._get(self._actor.write.remote(self._handle, path, to_chunks(data)))

    def export(self, host_dir: str | Path, subdir: str = "") -> list[str]:
        cap = self.limits.transfer_bytes  # as a local export's
        archive = bytearray()
        for chunk in self._stream(self._actor.archive.remote(self._handle, subdir)):
            archive += chunk
            if len(archive) > cap:
                raise SandboxError(f"the workspace came back over {cap} bytes from {self.node}")
        return ctr.extract_tar(bytes(archive), Path(host_dir), cap) if archive else []

    def add_inputs(self, more: Inputs) -> None:
        combined = self.inputs.extended(more)  # a name taken already is refused here
        self._get(self._actor.add_inputs.remote(self._handle, ship(more)))
        self.inputs = combined

    def renew(self, inputs: Inputs) -> None:
        self._get(self._actor.renew.remote(self._handle, ship(inputs)))
        self.inputs = inputs

    def pause(self, folder: str | Path) -> None:
        """Checkpoint the sandbox on its node into `folder` here (made here, owner-only,
        sealed with this server's key) and remove its container; RayPool.resume brings it
        back on any node. PauseError as DockerSandbox.pause's."""
        folder = Path(folder)
        if folder.exists():
            raise PauseError(f"{folder} exists already: pause into a new folder")
        most = (self.limits.memory_mb + self.limits.workspace_mb + self.limits.tmp_mb + 256) << 20
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder.parent) as archive:  # on the session's disk
            got = 0
            for chunk in self._stream(self._actor.pause.remote(self._handle)):
                got += len(chunk)
                if got > most:  # a node's answer is capped here too
                    raise PauseError(f"the checkpoint from node {self.node} passed {most} bytes")
                archive.write(chunk)
            archive.seek(0)
            folder.mkdir(mode=0o700, parents=True)
            try:
                with tarfile.open(fileobj=archive, mode="r:") as tar:  # plain tar only
                    tar.extractall(folder, filter="data")
                checkpoint.seal(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
        self.close()  # its container went with the pause

    def close(self) -> None:
        with self._closing:
            if self._closed:
                return
            self._closed = True
        try:
            self._get(self._actor.close.remote(self._handle))
        except SandboxError as error:  # its node is gone: so is the container (or the
            log.info("sandbox on node %s: %s", self.node, error)  # server removes it)
        finally:
            self._pool.released(self.node)


def ship(inputs: Inputs | Sequence[str | Path]) -> dict[str, Chunks]:
    """Each input's bytes into the object store, in chunks: {name: refs}."""
    shipped = {}
    for item in Inputs.from_paths(inputs):
        with open(item.path, "rb") as f:
            shipped[item.name] = [ray.put(b) for b in iter(lambda: f.read(CHUNK), b"")]
    return shipped


class RayPool:
    """The server's sandboxes on a Ray cluster: `acquire` as SandboxPool's, `size` warm ones
    on each node."""

    def __init__(self, address: str, size: int, limits: Limits, image: str | None = None):
        self.size, self.limits, self.image = size, limits, image
        self.address = address
        self._actors: dict[str, Any] = {}
        self._held: Counter[str] = Counter()  # this server's sandboxes on each node
        # nodes found lost before the cluster says so (a restarted node has a new id)
        self._lost: set[str] = set()
        self._gone: list[Any] = []  # their actors
        self._lock = threading.Lock()
        before = signal.getsignal(signal.SIGTERM)  # ray.init puts a plain exit there
        try:
            ray.init(
                address=address,
                namespace=f"sandcell-serve-{uuid.uuid4().hex[:12]}",
                logging_level=logging.ERROR,
                log_to_driver=False,  # a session's story is its trace
            )
        except ConnectionError as error:
            raise SandboxUnavailable(f"no Ray cluster answers at {address} ({error})") from None
        finally:
            signal.signal(signal.SIGTERM, before)
        if not self.slots():
            ray.shutdown()
            raise SandboxUnavailable(no_slots(address))
        self._refresh()

    def slots(self) -> dict[str, int]:
        """The nodes offering sandboxes now: {node id: slots it declared}."""
        return {
            n["NodeID"]: int(n["Resources"][RESOURCE])
            for n in ray.nodes()
            if n["Alive"] and n["Resources"].get(RESOURCE) and n["NodeID"] not in self._lost
        }

    def _refresh(self) -> dict[str, int]:
        """A SandboxNode on each node offering sandboxes that has none (nodes that joined)."""
        slots = self.slots()
        node_class = ray.remote(SandboxNode)
        for node, count in slots.items():
            if node not in self._actors:
                self._actors[node] = node_class.options(
                    num_cpus=0,
                    max_concurrency=4 * count + 8,  # cells, their interrupts, files, stops
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(self.size, self.limits, self.image)
        return slots

    def room(self) -> bool:
        with self._lock:
            slots = self._refresh()
            return any(count > self._held[node] for node, count in slots.items())

    def _place(self, skip: set[str] = frozenset()) -> tuple[str, Any]:  # type: ignore[assignment]
        """The node with the most free slots (but those in `skip`), one of them taken;
        SandboxUnavailable if none."""
        with self._lock:
            slots = self._refresh()
            free = {node: n - self._held[node] for node, n in slots.items() if node not in skip}
            node = max(free, key=lambda n: free[n], default=None)
            if node is None or free[node] <= 0:
                raise SandboxUnavailable(
                    f"every `{RESOURCE}` slot of the Ray cluster at {self.address} is taken "
                    f"({sum(slots.values())} in all): start a node, or wait for a session to idle"
                )
            self._held[node] += 1
            return node, self._actors[node]

    def _on_a_node(self, inputs: Inputs, start: Callable[[NodeSandbox], None]) -> NodeSandbox:
        """A NodeSandbox on the node with the most free slots, `start`ed there; a node found
        lost meanwhile (or not answering) is left out and the next one tried
        (SandboxUnavailable: none left)."""
        tried: set[str] = set()
        while True:
            node, actor = self._place(tried)
            sandbox = NodeSandbox(self, node, actor, secrets.token_hex(8), inputs)
            try:
                start(sandbox)
                return sandbox
            except (NodeLost, NodeUnavailable):
                tried.add(node)
                sandbox.close()
            except BaseException:
                sandbox.close()
                raise

    def acquire(
        self, inputs: Inputs | Sequence[str | Path] = (), *, allow_net: Sequence[str] | None = None
    ) -> NodeSandbox:
        """A sandbox on the node with the most free slots; SandboxUnavailable when none has one.
        `allow_net`: its network narrowed to those entries, on its node."""
        inputs = Inputs.from_paths(inputs)
        narrowed = None if allow_net is None else tuple(allow_net)

        def start(sandbox: NodeSandbox) -> None:
            acquired = sandbox._actor.acquire.remote(sandbox._handle, ship(inputs), narrowed)
            sandbox._get(acquired)

        return self._on_a_node(inputs, start)

    def resume(self, folder: Path, inputs: Inputs) -> NodeSandbox:
        """The sandbox paused into `folder` (NodeSandbox.pause, on any node), restored on the
        node with the most free slots, once this server's seal holds; PauseError when it
        cannot be (nothing is left running)."""
        checkpoint.Paused.read(folder)  # this server's key: refused before anything moves

        def start(sandbox: NodeSandbox) -> None:
            actor, handle = sandbox._actor, sandbox._handle
            with tempfile.TemporaryFile() as archive:
                with tarfile.open(fileobj=archive, mode="w") as tar:
                    tar.add(folder / checkpoint.STATE, arcname=checkpoint.STATE)
                    tar.add(folder / checkpoint.SAVED, arcname=checkpoint.SAVED)
                archive.seek(0)
                for chunk in iter(lambda: archive.read(CHUNK), b""):  # one object at a time
                    sandbox._get(actor.receive.remote(handle, ray.put(chunk)))
            sandbox._get(actor.resume.remote(handle, ship(inputs)))

        return self._on_a_node(inputs, start)

    def lost(self, node: str) -> bool:
        """Whether `node` is gone: found lost before, or its actor does not answer a ping (one
        round trip, asked as each turn of a session begins). The first time, what it held is
        forgotten and the other nodes remove the containers it left where they share its
        engine."""
        with self._lock:
            actor = None if node in self._lost else self._actors.get(node)
        if actor is None:
            self.forget(node)
            return True
        try:
            ray.get(actor.ping.remote(), timeout=PING_S)
        except ray.exceptions.ActorDiedError:
            self.forget(node)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False  # unavailable for now: the turn's call says so if it stays so
        return False

    def forget(self, node: str) -> None:
        with self._lock:
            self._lost.add(node)
            gone = self._actors.pop(node, None)
            others = list(self._actors.values())
        if gone is not None:
            log.warning("Ray node %s was lost with its sandboxes", node)
            self._gone.append(gone)  # asked to shut down at the end all the same
            for actor in others:
                actor.reap.remote()

    def released(self, node: str) -> None:
        with self._lock:
            self._held[node] -= 1

    def held(self) -> dict[str, int]:
        with self._lock:
            return {node: count for node, count in self._held.items() if count}

    def close(self) -> None:
        """Every node's sandboxes and pool removed, then the connection closed."""
        actors = [*self._actors.values(), *self._gone]
        try:
            done = [actor.shutdown.remote() for actor in actors]
            if done:
                ray.wait(done, num_returns=len(done), timeout=SHUTDOWN_S)
            for actor in actors:
                ray.kill(actor)
        finally:
            self._actors.clear()
            ray.shutdown()


def no_slots(address: str) -> str:
    return (
        f"no node of the Ray cluster at {address} offers the `{RESOURCE}` resource; start "
        "each node that has Docker and the image with `ray start --address ... --resources "
        f"'{{\"{RESOURCE}\": N}}'`"
    )


def reachable(address: str) -> None:
    """ray.init waits minutes for a cluster address where nothing listens; a plain TCP
    connect says so at once."""
    target = address
    if address == "auto":
        try:
            target = ray._private.utils.read_ray_address()  # the cluster `ray start` left here
        except AttributeError:
            return
    if not target or "://" in target:
        return  # no cluster here (ray.init says so) or a ray:// client address
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except (OSError, ValueError) as error:
        raise SandboxUnavailable(
            f"no Ray cluster answers at {target} ({getattr(error, 'strerror', None) or error}); "
            "start one with `ray start --head --resources '{\"sandcell\": 2}'` or give the "
            "head's address to --ray"
        ) from None
