"""DockerSandbox: stateful Python in a sealed, resource-limited container.

One container per sandbox; its PID 1 is a small supervisor that (re)starts the kernel,
so the workspace (a tmpfs) survives kernel restarts. The host talks to the kernel over
ipc sockets: on a local engine (transport `ipc`) in a connection directory it bind-mounts
and seals once the kernel is up; on any other (transport `stream`) in a private folder of
its own, carried to the container over an exec stream (sandbox/stream.py), with the inputs
in a volume of the sandbox's (sandbox/volumes.py).
"""

import json
import os
import shutil
import signal
import tempfile
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import docker
import docker.errors
import requests
from docker.models.containers import Container
from jupyter_client import BlockingKernelClient

from sandcell.sandbox import boundary, checkpoint, image_build, kernel, transport, volumes
from sandcell.sandbox import container as ctr
from sandcell.sandbox.allowlist import Allowlist
from sandcell.sandbox.errors import SandboxError, SandboxUnavailable
from sandcell.sandbox.execution import Execution
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.limits import Limits
from sandcell.sandbox.net_link import NetLink
from sandcell.sandbox.net_proxy import ConnectionRecord, NetLimits, NetProxy
from sandcell.sandbox.stream import StreamLink
from sandcell.sandbox.wheelhouse import Offer, index_hash, offer, resolve


def wheelhouse_offer(
    client: docker.DockerClient | None, image: str | None, folder: str | None
) -> Offer:
    """What a sandbox of `image` gets of the wheelhouse `folder` (or wheelhouse.DEFAULT):
    mounted when it was made for the image's Python and machine, else not, with why.
    `client`: None asks a client of its own, closed after."""
    folder = resolve(folder)
    if folder is None:
        return Offer()
    own = client is None
    try:
        client = client or ctr.engine()
        platform = image_build.image_platform(client, image or ctr.DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        return Offer(refused="the image is not built, so its Python is unknown")
    except (SandboxUnavailable, docker.errors.DockerException, requests.RequestException) as error:
        return Offer(
            refused=f"the image's Python is unknown ({error}): the wheelhouse is not mounted"
        )
    finally:
        if own and client is not None:
            client.close()
    return offer(folder, *platform)


# A gVisor kernel starts in about 2 s alone; on a 2-core machine under load (four test workers
# starting sandboxes beside a generating model server) whole starts of 60 s were measured.
# A kernel that never answers is rare: a container that stops ends the wait within a second.
READY_TIMEOUT_S = 120.0


def _sandbox_path(path: str) -> str:
    """Relative paths are in /workspace; absolute ones are taken as they are (inside)."""
    return path if path.startswith("/") else f"{boundary.WORKSPACE}/{path}"


# The in-image file helper (images/files.py) raises these by name (exit status 2).
_FILE_ERRORS: dict[str, type[Exception]] = {
    "FileNotFoundError": FileNotFoundError,
    "IsADirectoryError": IsADirectoryError,
    "PermissionError": PermissionError,
}


class DockerSandbox:
    def __init__(
        self,
        limits: Limits | None = None,
        inputs: Inputs | Sequence[str | Path] = (),
        image: str | None = None,
        runtime: str | None = None,
        label: str | None = None,
        staging: bool = False,
        resume_from: str | Path | None = None,
    ):
        """A new sandbox; with `resume_from`, the one paused into that folder (pause()),
        restored with its kernel as it was: PauseError (nothing started) when it cannot be."""
        self.limits = limits or Limits()
        if runtime is not None:  # the same as Limits(runtime=...): one place holds it
            self.limits = replace(self.limits, runtime=runtime)
        self.image = image or ctr.DEFAULT_IMAGE
        self.label = label or uuid.uuid4().hex[:12]  # the container's sandcell.session label
        self.inputs = Inputs.from_paths(inputs)
        self.client = ctr.engine()
        self.gvisor = ctr.check_runtime(self.client, self.limits.runtime)
        ctr.reap_orphans(self.client)
        self.transport = transport.choose(self.client, self.limits.transport, self.image)
        self.streamed = self.transport.name == "stream"
        self.wheelhouse = self._wheelhouse()
        resume = Path(resume_from) if resume_from else None
        paused = self._restorable(resume, staging) if resume else None
        self.conn_dir, info = self._connection_folder(paused)
        # A pool sandbox gets its inputs later: it mounts a private, empty staging folder
        # (over the stream transport its volume takes them).
        self.staging = staging
        self.staging_dir = (
            ctr.make_staging(self.conn_dir) if staging and not self.streamed else None
        )
        mounts = self.inputs.mounts()
        if paused is not None and self.staging_dir is not None:  # as they were at the pause
            _link_inputs(self.staging_dir, self.inputs.mounts())
            mounts = {}
        self._info = info
        self._client: BlockingKernelClient | None = None
        # The live kernel client, also held by the finalizer: a sandbox dropped without
        # close() must still close its ZMQ sockets. Left to the garbage collector, a context
        # whose sockets were collected first blocks forever in zmq_term (seen in a test run).
        self._live: list[BlockingKernelClient] = []
        self._links: list[StreamLink] = []  # the stream transport's bridge, while there is one
        self.volume: str | None = None  # the stream transport's inputs, when it has any
        self._volumes: list[str] = []  # the stream transport's volumes, removed with it
        self.container: Container  # set by _start, below
        self._finalizer = weakref.finalize(
            self, _cleanup, self.client, None, self.conn_dir, self._live, self._links,
            self._volumes,
        )  # fmt: skip
        self._net = self._net_proxy()  # before the container: it mounts the proxy's folder
        started = time.monotonic()
        self._start(mounts, resume / checkpoint.SAVED if resume else None)
        self.start_seconds = time.monotonic() - started
        self.container.reload()  # the attributes from `run` predate the start: no PID yet
        # found once: each cell reads only the counter, not /proc and the cgroup tree
        self._oom_file = _oom_counter_file(
            self.container.attrs.get("State", {}).get("Pid"), self.container.id
        )

    # -- lifecycle -------------------------------------------------------------------
    def _net_proxy(self) -> NetProxy | None:
        """With an allowlist, the host's proxy for this sandbox on a socket in a folder of its
        own (removed with the sandbox), its connections' records kept in net_connections;
        None without one."""
        self.net_connections: deque[ConnectionRecord] = deque(maxlen=NET_RECORDS)
        self._net_pending: deque[ConnectionRecord] = deque(maxlen=NET_RECORDS)  # for the next cell
        self._net_links: list[NetLink] = []  # the stream transport's way to it, once started
        if not self.limits.allow_net:
            return None
        allowlist = Allowlist.parse(self.limits.allow_net)
        folder = Path(tempfile.mkdtemp(prefix=NET_PREFIX))
        if not self.streamed:  # mounted: the sandbox's uid may reach the socket, not write there
            folder.chmod(0o755)
        limits = NetLimits(total_bytes=self.limits.net_mb << 20)
        kept, pending = self.net_connections, self._net_pending

        def ended(record: ConnectionRecord) -> None:  # on the proxies' loop; holds no self:
            kept.append(record)  # the finalizer below must not keep the sandbox alive
            pending.append(record)

        proxy = NetProxy(allowlist, folder / "net.sock", limits, ended)
        _listen(proxy)
        # once: close or GC; the links first (their pipes end), then the proxy
        self._net_finalizer = weakref.finalize(self, _close_net, proxy, self._net_links)
        return proxy

    def narrow_net(self, entries: Sequence[str] | None) -> None:
        """From now on, only those of `entries` its --allow-net covers (a serve user's
        allow-net= in --users); None: all of them again. A renewal keeps it: a pool sets it
        on every acquire."""
        if self._net is None:
            if entries is None:
                return
            raise SandboxError("this sandbox was started without --allow-net: nothing to narrow")
        server = Allowlist.parse(self.limits.allow_net)
        self._net.allowlist = (
            server if entries is None else server.narrowed(Allowlist.parse(entries))
        )

    def _wheelhouse(self) -> Offer:
        """The operator's wheelhouse, mounted where it fits the image; never over the stream
        transport (it is a folder of this machine)."""
        if self.streamed and resolve(self.limits.wheelhouse) is not None:
            return Offer(refused=STREAMED_WHEELHOUSE)
        return wheelhouse_offer(self.client, self.image, self.limits.wheelhouse)

    def _connection_folder(self, paused: checkpoint.Paused | None) -> tuple[str, dict]:
        """The host's folder of the kernel's sockets, and the connection info: bind-mounted
        (ipc), or private to the host, its sockets reached through the bridge (stream)."""
        if self.streamed:
            return tempfile.mkdtemp(prefix=kernel.CONN_PREFIX), kernel.new_connection_info()
        return kernel.make_connection_dir(paused.connection if paused else None)

    def _start(self, mounts: dict[str, Path], saved: Path | None) -> None:
        """The container started (or restored from the checkpoint `saved`) and connected."""
        if self.streamed:
            attached = self._streamed_volumes(mounts)
        else:
            attached = ctr.bind_mounts(
                self.conn_dir, mounts, self.staging_dir, self.wheelhouse.mount
            )
            if self._net is not None:  # read-only: a Unix socket there still connects
                attached[str(self._net.path.parent)] = {"bind": boundary.NET_DIR, "mode": "ro"}
        self.container = ctr.start(
            self.client, self.image, self.limits, self.label, self.conn_dir, attached,
            gvisor=self.gvisor, checkpoint=saved, streamed=self.streamed,
        )  # fmt: skip
        self._refinalize(self.container)
        if self._net is not None and self.streamed:  # the pipes to the proxy: from now
            self._net_links.append(NetLink(self.container, self._net.path))
            self._net_links[0].open()
        if saved is not None:  # the restored supervisor starts a relay for its kernel
            ctr.send_signal(self.container, boundary.NEW_RELAY.name)
        self._new_kernel(None)
        if saved is not None:
            self._in_kernel("after_resume()")

    def _streamed_volumes(self, mounts: dict[str, Path]) -> dict:
        """The stream transport's volumes, made (removed with the sandbox): the bridge's key
        folder, and the inputs' (filled with `mounts`) where there are or may be inputs."""
        labels = ctr.labels(self.label)
        key = volumes.create_key(self.client, labels, ctr.BRIDGE_UID, ctr.SANDBOX_UID)
        self._volumes.append(key)
        attached = {key: {"bind": boundary.KEY_DIR, "mode": "rw"}}
        if mounts or self.staging:
            self.volume = volumes.create(self.client, labels)
            self._volumes.append(self.volume)
            self._place(mounts, emptied=False)
            attached[self.volume] = {"bind": boundary.DATA, "mode": "ro"}
        return attached

    def _refinalize(self, container: Container | None) -> None:
        """The finalizer again, holding the container to remove now."""
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _cleanup, self.client, container, self.conn_dir, self._live, self._links,
            self._volumes,
        )  # fmt: skip

    def _new_kernel(self, sent: signal.Signals | None, new_key: bool = False) -> None:
        """Have the supervisor start a new kernel (`sent` asks for it: restart, renewal; None
        at the start, when it starts one by itself) and connect to it; with `new_key`, under
        a new connection key. ipc: the folder unsealed and its socket files noted first, so
        only the new relay's are taken. stream: the last bridge closed (it noted the relay
        it reached), then a new one that awaits another relay's sockets, and hands over the
        key the supervisor waits for (always at the start)."""
        self._set_client(None)
        if not self.streamed:
            replacing = None
            if sent is not None:
                kernel.unseal(self.conn_dir)
                replacing = kernel.socket_files(self.conn_dir, self._info)
                if new_key:
                    self._info = kernel.rotate_key(self.conn_dir, self._info)
                ctr.send_signal(self.container, sent.name)
            self._set_client(self._connect(replacing))
            return
        before = None
        for old in self._links:
            before = old.reached
            old.close()
        self._links.clear()
        if sent is not None:
            ctr.send_signal(self.container, sent.name)
        handed = None
        if new_key or sent is None:
            self._info = dict(self._info, key=kernel.new_connection_info()["key"])
            handed = self._info
        try:
            link = StreamLink.start(
                self.container, self.conn_dir, handed, before,
                check=lambda: ctr.check_running(self.container),
            )  # fmt: skip
        except (SandboxError, docker.errors.DockerException, requests.RequestException) as error:
            self.close()  # no kernel to reach: never a sandbox half there
            raise SandboxError(f"the sandbox has no kernel to reach: {error}") from None
        self._links.append(link)
        self._set_client(self._connect())

    def _connect(self, replacing: list | None = None) -> BlockingKernelClient:
        """Connect once the kernel answers; after a restart, only to the new relay."""
        check = self._stopped_while_waiting
        try:
            if (
                replacing is not None
                and not self.streamed
                and not kernel.await_new_sockets(
                    self.conn_dir, self._info, replacing, READY_TIMEOUT_S, check=check
                )
            ):
                raise RuntimeError("no new relay")
            client = kernel.connect(self.conn_dir, self._info, READY_TIMEOUT_S, check=check)
        except SandboxError as error:  # the container stopped while the kernel started
            log = self._container_log()
            self.close()
            raise SandboxError(f"{error}{log}") from None
        except RuntimeError:  # after SandboxError, which is one
            log = self._kernel_log()
            self.close()
            raise SandboxError(f"the kernel did not start within {READY_TIMEOUT_S:.0f} s.\n{log}")
        if not self.streamed:
            kernel.seal(self.conn_dir)
        return client

    def _stopped_while_waiting(self) -> None:
        """Raise SandboxError if the container has stopped or is gone, or the bridge to it
        ended. An engine too busy to answer says nothing about the container: the wait for
        the kernel goes on."""
        for link in self._links:
            link.check()
        try:
            ctr.check_running(self.container)
        except (docker.errors.APIError, requests.exceptions.RequestException):
            pass

    def _kernel_log(self) -> str:
        try:
            _, out, _ = ctr.exec_in(self.container, ["tail", "-c", "2000", boundary.KERNEL_LOG])
            return out.decode(errors="replace")
        except docker.errors.DockerException:
            return ""

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _set_client(self, client: BlockingKernelClient | None) -> None:
        """Disconnect the current kernel client (if any) and use `client` (or none)."""
        if self._client is not None:
            kernel.disconnect(self._client)
        self._client = client
        self._live[:] = [client] if client is not None else []

    def close(self) -> None:
        self._set_client(None)
        closing = getattr(self, "_net_finalizer", None)  # absent: no proxy, or none made yet
        if closing is not None:  # first: no pipe tries the container once it is going
            closing()
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def _kernel_client(self) -> BlockingKernelClient:
        """The kernel client: there is one whenever a cell or a call to the kernel can run."""
        assert self._client is not None
        return self._client

    # -- running code ----------------------------------------------------------------
    def run(
        self, code: str, timeout: float | None = None, *, on_output: kernel.OnOutput | None = None
    ) -> Execution:
        """Run one cell. `on_output` is called with each stdout/stderr chunk as it arrives
        (ANSI stripped, within the caps); an exception it raises is raised after the cell."""
        self._check_open()
        if timeout is None:
            timeout = self.limits.timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        started = time.monotonic()
        oom_before = self._oom_kills()
        limits = self.limits
        collector = kernel.Collector(
            code,
            limits.output_bytes,
            on_output,
            rich_outputs=limits.rich_outputs,
            rich_bytes=limits.rich_bytes,
        )
        ex = collector.execution
        kernel.flush_shell(self._kernel_client)
        msg_id = self._kernel_client.execute(code, allow_stdin=False, stop_on_error=False)
        deadline = started + timeout
        while True:
            state = kernel.drain(self._kernel_client, msg_id, collector, deadline)
            if state == "done":
                kernel.await_reply(self._kernel_client, msg_id)
                break
            if state == "silent":
                if self._kernel_died():
                    ex.restarted = "out of memory" if self._oom_kills() > oom_before else "died"
                    self._hard_restart()
                    break
                continue
            ex.timed_out = True
            if self._interrupt_within_grace(msg_id, collector):
                ex.interrupted = True
                ctr.send_signal(self.container, boundary.SWEEP.name)  # the cell's strays go too
            else:
                ex.restarted = "timeout"
                self._hard_restart()
            break
        if ex.error is not None and ex.error.name == "KeyboardInterrupt":
            ex.interrupted = True
        ex = collector.finish(time.monotonic() - started)
        ex.net = self._net_records()
        if collector.callback_error is not None:
            raise collector.callback_error
        return ex

    def _net_records(self) -> list[dict]:
        """The connections that ended since the last cell, taken (at most NET_RECORDS); one
        still open gets NET_SETTLE_S to end (a response the cell closed as it returned)."""
        if self._net is not None:
            self._net.settle(NET_SETTLE_S)
        taken: list[dict] = []
        while self._net_pending and len(taken) < NET_RECORDS:
            taken.append(asdict(self._net_pending.popleft()))
        self._net_pending.clear()  # past the cap: the sandbox's net_connections keep the last
        return taken

    def _interrupt_within_grace(self, msg_id: str, collector: kernel.Collector) -> bool:
        """Interrupt the cell and wait the grace for the kernel to say it is idle. A kernel
        that has sent the cell's KeyboardInterrupt has stopped it and is finishing up (its
        post-run hooks; slow on a loaded machine): it gets twice the grace more before it is
        taken for stuck and restarted, which would lose every variable."""
        kernel.interrupt(self._kernel_client)
        grace = self.limits.interrupt_grace_s
        grace_end, extended = time.monotonic() + grace, False
        while True:
            if kernel.drain(self._kernel_client, msg_id, collector, grace_end) == "done":
                return True
            if time.monotonic() < grace_end:
                continue
            error = collector.execution.error
            if extended or error is None or error.name != "KeyboardInterrupt":
                return False
            grace_end, extended = grace_end + 2 * grace, True

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("this sandbox is closed; start a new one")

    def interrupt(self) -> None:
        """Interrupt the running cell (KeyboardInterrupt); kernel state is kept. During a
        restart (another thread's) there is no kernel to interrupt: the restart stops it."""
        self._check_open()
        client = self._client
        if client is not None:
            kernel.interrupt(client)

    def restart(self) -> None:
        """A fresh kernel: variables are lost, workspace files are kept."""
        self._check_open()
        self._hard_restart()

    def _hard_restart(self) -> None:
        """Kill every process but the supervisor, which then starts a fresh kernel."""
        ctr.check_running(self.container)
        self._new_kernel(boundary.RESTART)

    # -- pausing (gVisor) ----------------------------------------------------------------
    def pause(self, folder: str | Path) -> None:
        """Checkpoint this sandbox into `folder` (made here, owner-only) and remove its
        container: DockerSandbox(..., resume_from=folder) brings it back, every variable
        with it. Only under gVisor, with a local engine that has checkpoints. On PauseError
        `folder` is not left, and the sandbox runs on as it was unless the error says it
        ended (runsc ends a sandbox whose checkpoint failed)."""
        self._check_open()
        if self.streamed:
            raise checkpoint.PauseError(STREAMED_PAUSE)
        if self.limits.allow_net:
            raise checkpoint.PauseError(NET_PAUSE)
        if not self.gvisor:
            raise checkpoint.PauseError(
                "only a sandbox under gVisor (--runtime runsc) can be paused: runc's checkpoints "
                "need CRIU, which fails on this kernel"
            )
        folder = Path(folder)
        if folder.exists():
            raise checkpoint.PauseError(f"{folder} exists already: pause into a new folder")
        checkpoint.engine_reachable(self.client, self.container.id)
        checkpoint.key()  # made (or refused) now, before anything stops
        paused = checkpoint.Paused(
            connection=self._info,
            limits=self.limits.to_dict(),
            **self._identity(staging=self.staging),
        )
        if not self._in_kernel("before_pause()"):
            self._in_kernel("after_resume()")
            raise checkpoint.PauseError("the kernel did not make ready for a pause (busy?)")
        self._set_client(None)  # no host socket may be connected at the checkpoint
        checkpointed = False
        try:
            self._quiesce()
            checkpoint.create(self.client, self.container.id)
            checkpointed = True
            folder.mkdir(mode=0o700, parents=True)
            checkpoint.copy_out(self.client, self.container.id, folder / checkpoint.SAVED)
            paused.write(folder)
        except BaseException as error:
            shutil.rmtree(folder, ignore_errors=True)
            self._recover(error, checkpointed)
            raise
        self.close()

    def _recover(self, error: BaseException, checkpointed: bool) -> None:
        """After a failed pause: the sandbox as it was (started again from the engine's
        checkpoint if it had been taken), else PauseError saying it ended."""
        try:
            if checkpointed:
                try:
                    checkpoint.start_from(self.client, self.container.id)
                finally:
                    checkpoint.forget(self.client, self.container.id)
            self._relay_again()
        except SandboxError as ended:  # PauseError is one
            self.close()
            raise checkpoint.PauseError(f"{error}; the sandbox ended with it ({ended})") from None

    def _quiesce(self) -> None:
        """The relay stopped and its sockets gone from the connection folder: a checkpoint
        tried while a host socket is still open fails and ends the whole sandbox (runsc)."""
        kernel.unseal(self.conn_dir)
        ctr.send_signal(self.container, boundary.QUIESCE.name)
        gone = kernel.await_sockets(
            self.conn_dir,
            self._info,
            lambda now: not any(now),
            30,
            check=self._stopped_while_waiting,
        )
        if not gone:
            raise checkpoint.PauseError("the sandbox's relay did not stop within 30 s")

    def _relay_again(self) -> None:
        """After a failed pause: a new relay, and the host connected to it again."""
        ctr.check_running(self.container)
        kernel.unseal(self.conn_dir)
        before = kernel.socket_files(self.conn_dir, self._info)
        ctr.send_signal(self.container, boundary.NEW_RELAY.name)
        self._set_client(self._connect(replacing=before))
        self._in_kernel("after_resume()")

    def _in_kernel(self, call: str) -> bool:
        """Call one of the kernel extension's own functions, silently (no history, no
        output, no execution count): True once it answered ok and returned True."""
        code = f"import {boundary.KERNEL_EXTENSION} as _s\nassert _s.{call}\ndel _s"
        msg_id = self._kernel_client.execute(code, silent=True, store_history=False)
        reply = kernel.await_reply(self._kernel_client, msg_id, 30)
        return reply is not None and reply["content"].get("status") == "ok"

    def _runtime_name(self) -> str:
        return self.limits.runtime or self.client.info().get("DefaultRuntime", "runc")

    def _identity(self, staging: bool) -> dict:
        """What a restore must match (Paused's fields): the image (its content hash, the
        label `sandcell image build` gives it; an image without one, by its id), runsc's
        version, and the mounts as they were (gVisor restores the same mounts): the inputs by
        their sha256, the wheelhouse by its index. No engine-local id, no host path: a pause
        taken on one machine (a Ray node) restores on another with the same image."""
        image = self.client.images.get(self.image)
        house = self.wheelhouse.mount
        return {
            "image_id": (image.labels or {}).get(image_build.LABEL_HASH) or image.id,
            "runsc": checkpoint.runsc_version(self.client, self._runtime_name()),
            "mounts": {
                "inputs": {item.name: item.sha256 for item in self.inputs},
                "staging": staging,
                "wheelhouse": index_hash(house) if house else None,
            },
        }

    def _restorable(self, folder: Path, staging: bool) -> checkpoint.Paused:
        """The pause in `folder`, once it is this machine's and matches what this sandbox
        would mount and run: PauseError (said why) otherwise."""
        paused = checkpoint.Paused.read(folder)
        if self.streamed:
            raise checkpoint.PauseError(STREAMED_PAUSE)
        if self.limits.allow_net:
            raise checkpoint.PauseError(NET_PAUSE)
        if not self.gvisor:
            raise checkpoint.PauseError("a paused sandbox resumes only under gVisor (runsc)")
        now = self._identity(staging)
        differ = [
            what.removesuffix("_id")
            for what, value in now.items()
            if getattr(paused, what) != value
        ]
        if differ:
            raise checkpoint.PauseError(
                f"the paused sandbox in {folder} was made with another {' and '.join(differ)}: "
                "it is not restored"
            )
        return paused

    def renew(self, inputs: Inputs | Sequence[str | Path] = ()) -> None:
        """Make this sandbox what a fresh one would be for a new job, in the same container
        (a fraction of a new container's cost): every process of the last job killed
        (background, daemonized, in another session, ignoring signals or stuck in a cell),
        the workspace, /tmp, /dev/shm and /dev/mqueue emptied, System V IPC objects removed,
        a fresh kernel with a new connection key, and /data holding exactly `inputs`.
        Under gVisor (runsc 2022-12) System V IPC objects cannot be listed, so they stay:
        SandboxPool.release does not renew a gVisor sandbox for that reason.

        Only a sandbox started with staging=True (a pool's) can be renewed. If the renewal
        cannot be completed (the container stopped, a process outlived the kill, a file
        could not be removed, no kernel started) the sandbox is closed and SandboxError
        raised: start a new one. A bad input path raises InputError before anything changes."""
        self._check_open()
        if not self.staging:
            raise SandboxError(
                "only a sandbox started with staging=True (a pool's) can be renewed: its /data "
                "is a folder the host fills; start a new sandbox instead"
            )
        fresh = Inputs.from_paths(inputs)
        try:
            ctr.check_running(self.container)
            self._new_kernel(boundary.RENEW, new_key=True)
            if self._net is not None:  # no connection of the last job, and a new byte budget
                self._net.close()
                self._net.used = 0
                self._net_pending.clear()  # nor a record of one: the next job may be another
                self.net_connections.clear()  # user's
                _listen(self._net)
            # The supervisor kills the last job's processes before it starts the kernel just
            # reached: only now may /data change, so none of them can see the new inputs.
            self._place(fresh.mounts(), emptied=True)
            self.inputs = fresh
        except SandboxError as error:
            self.close()
            raise SandboxError(f"the sandbox could not be renewed: {error}") from None
        except BaseException:  # re-raised: a half-renewed sandbox must never run a job
            self.close()
            raise

    def _container_log(self) -> str:
        """The supervisor's last words (why it ended), if the engine still has them."""
        try:
            text = self.container.logs(tail=3).decode(errors="replace").strip()
        except (docker.errors.DockerException, requests.exceptions.RequestException):
            return ""
        return f" ({text})" if text else ""

    def _kernel_died(self) -> bool:
        if any(link.ended for link in self._links):
            return True  # the bridge went: a restart makes a new one, with a new kernel
        if kernel.beating(self._kernel_client, self.conn_dir, self._info):
            return False
        ctr.check_running(self.container)
        if self.gvisor:  # `docker top` of a runsc container lists host processes: ask inside
            alive = f"cat /proc/[0-9]*/cmdline 2>/dev/null | grep -qa {boundary.KERNEL_MODULE}"
            return ctr.exec_in(self.container, ["sh", "-c", alive])[0] != 0
        # Podman reads its own descriptors on the host (its `ps` options, without a dash), and
        # answers nothing to Docker's, which it would run with an image's `ps` (none here)
        listed = "pid,args" if ctr.is_podman(self.client) else "-eo pid,args"
        processes = self.container.top(ps_args=listed).get("Processes") or []
        return not any(boundary.KERNEL_MODULE in " ".join(p) for p in processes)

    def _oom_kills(self) -> int:
        """The container's OOM-kill count, 0 where the host cannot read it."""
        if self._oom_file is None:
            return 0
        try:
            for row in self._oom_file.read_text().splitlines():
                if row.startswith("oom_kill "):
                    return int(row.split()[1])
        except OSError:
            pass
        return 0

    # -- files -----------------------------------------------------------------------
    def _files(self, *args: str, stdin: bytes | None = None, max_out: int | None = None) -> bytes:
        """Run the image's file helper; its named errors come back as Python exceptions, and
        a helper that stalls or breaks (model code can stop it: same uid) as SandboxError."""
        self._check_open()
        try:
            code, out, err = ctr.exec_in(
                self.container,
                ["python3", boundary.FILES_PROGRAM, *args],
                stdin=stdin,
                max_out=max_out or ctr.EXEC_OUT_BYTES,
                through_cat=self.gvisor,
            )
        except (OSError, docker.errors.DockerException) as error:
            raise SandboxError(f"the file helper failed ({args[0]}): {error}") from None
        if code in (0, -1) and not (code == -1 and err):  # -1: stopped reading at max_out
            return out
        message = err.decode(errors="replace").strip()
        kind, _, what = message.partition(": ")
        raised = _FILE_ERRORS.get(kind, SandboxError)
        raise raised(f"{args[0]} {args[1] if len(args) > 1 else ''}: {what or message}".strip())

    def _json(self, *args: str) -> object:
        """The helper's JSON answer; anything else (model code wrote into it) is an error."""
        try:
            return json.loads(self._files(*args))
        except ValueError as error:
            raise SandboxError(
                f"the file helper's answer is not JSON ({args[0]}): {error}"
            ) from None

    def stat(self, path: str) -> dict:
        info = self._json("stat", _sandbox_path(path))
        if not isinstance(info, dict):
            raise SandboxError(f"the file helper's stat of {path} is not an object")
        return info

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        limit = -1 if max_bytes is None else max_bytes
        cap = max_bytes or self.limits.transfer_bytes
        return self._files("read", _sandbox_path(path), str(limit), max_out=cap)

    def write(self, path: str, data: bytes) -> None:
        try:
            self._files("write", _sandbox_path(path), stdin=data)
        except OSError as error:
            raise SandboxError(f"writing {path} failed: {error}") from None

    def files(self) -> list[dict]:
        listed = self._json("list")
        if not isinstance(listed, list):
            raise SandboxError("the file helper's list of the workspace is not a list")
        return listed

    def run_checks(self, request: dict) -> dict:
        """Run the image's checker (images/checks.py) on `request` as a fresh `python -I`
        process, never in the kernel (in a renewed sandbox it hands the request to a checker
        the supervisor forks), and return its JSON answer. A checker that fails (killed at
        the timeout, out of memory) answers with that failure for every output."""
        self._check_open()
        command = ["timeout", "-s", "KILL", str(boundary.CHECKS_SECONDS), "python3", "-I",
                   boundary.CHECKS_PROGRAM]  # fmt: skip
        try:
            code, out, err = ctr.exec_in(
                self.container, command, stdin=json.dumps(request).encode(),
                max_out=boundary.checks_answer_bytes(request), through_cat=self.gvisor,
            )  # fmt: skip
        except (OSError, docker.errors.DockerException) as error:
            raise SandboxError(f"the output checks could not run: {error}") from None
        try:
            answer = json.loads(out) if code == 0 else None
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get("outputs"), dict):
            return answer
        why = (
            f"killed after {boundary.CHECKS_SECONDS} s"
            if code in (137, -9)
            else (err.decode(errors="replace").strip()[-300:] or f"exit status {code}")
        )
        failed: dict[str, object] = {"passed": False, "sha256": None, "failures": [
            {"column": None, "check": "checker", "count": 1, "examples": [],
             "message": f"the checks could not run: {why}"}
        ]}  # fmt: skip
        return {"outputs": {item["path"]: failed for item in request["outputs"]}}

    def export(self, host_dir: str | Path, subdir: str = "") -> list[str]:
        """Copy the workspace (or one folder of it) to host_dir; returns the files copied.
        Links and special files are left behind, so nothing can point outside host_dir."""
        archive = self.archive(subdir)
        cap = self.limits.transfer_bytes
        return [] if archive is None else ctr.extract_tar(archive, Path(host_dir), cap)

    def archive(self, subdir: str = "") -> bytes | None:
        """The workspace (or one folder of it) as the sandbox's helper tars it, at most
        `Limits.transfer_bytes`: hostile input, for `container.extract_tar` only; None when the
        folder does not exist."""
        try:
            tar = ["tar", *([subdir] if subdir else [])]
            return self._files(*tar, max_out=self.limits.transfer_bytes)
        except FileNotFoundError:
            if subdir:
                return None  # the folder does not exist: nothing to export
            raise SandboxError("export failed: the workspace is missing") from None

    def add_inputs(self, paths: Inputs | Sequence[str | Path]) -> None:
        """Give a pool sandbox its input files (read-only under /data)."""
        if not self.staging:
            raise SandboxError(
                "this sandbox takes no new inputs (they were fixed when it started); start "
                "a new session, or a DockerSandbox with every input"
            )
        more = Inputs.from_paths(paths)
        combined = self.inputs.extended(more)  # a name taken already is refused here
        self._place(more.mounts(), emptied=False)
        self.inputs = combined

    def _place(self, inputs: dict[str, Path], emptied: bool) -> None:
        """Inputs into /data (with `emptied`, in place of what it held): the staging folder
        of the ipc transport, or the volume of the stream transport."""
        if self.staging_dir is not None:
            if emptied:
                for link in self.staging_dir.iterdir():
                    link.unlink()
            _link_inputs(self.staging_dir, inputs)
        elif self.volume is not None:
            volumes.fill(
                self.client, self.image, self.volume, inputs,
                ctr.helper_options(self.client, self.label), emptied=emptied,
            )  # fmt: skip


STREAMED_WHEELHOUSE = (
    "the wheelhouse is a folder of this machine, and the engine is reached through its API "
    "(transport stream): it is not mounted"
)
STREAMED_PAUSE = (
    "pausing needs the ipc transport (a local engine that sees this machine's folders): "
    "gVisor's checkpoint is made and kept on the engine's machine"
)
NET_PAUSE = "a sandbox with --allow-net is not paused yet: it is closed, and rebuilt by replay"
NET_PREFIX = "sandcell-net-"  # the host's folder of a sandbox's proxy socket
NET_RECORDS = 1000  # the sandbox's last connections kept (net_connections)
NET_SETTLE_S = 0.1  # a cell's open connections may take to end (a kept-alive one: each cell)


def _link_inputs(staging_dir: Path, inputs: dict[str, Path]) -> None:
    """Inputs (name -> host file) into a pool sandbox's staging folder; all or none."""
    placed: list[Path] = []
    try:
        for name, path in inputs.items():
            target = staging_dir / name
            try:
                os.link(path, target)  # same filesystem: no copy at all
            except OSError:
                shutil.copyfile(path, target)
            placed.append(target)
            # No chmod: a hard link shares the user's inode (and its mode). The folder
            # is mounted read-only, which is what protects the file.
    except BaseException:  # re-raised: a failed add leaves the sandbox as it was
        for target in placed:
            target.unlink(missing_ok=True)
        raise


def _oom_counter_file(host_pid: int | None, container_id: str) -> Path | None:
    """The memory cgroup file (v1 or v2) holding the container's `oom_kill` count, when the
    engine runs on this machine: the process of that pid here is in the container's cgroup
    (an engine elsewhere gives the pid of its own machine)."""
    if not host_pid:
        return None
    try:
        lines = Path(f"/proc/{host_pid}/cgroup").read_text().splitlines()
    except OSError:
        return None  # not a Linux host, or the engine runs in a VM
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if container_id not in path:
            continue
        if "memory" in controllers.split(","):
            candidate = Path(f"/sys/fs/cgroup/memory{path}/memory.oom_control")
        elif controllers == "":
            candidate = Path(f"/sys/fs/cgroup{path}/memory.events")
        else:
            continue
        if candidate.exists():
            return candidate
    return None


def _listen(proxy: NetProxy) -> None:
    proxy.start()
    proxy.path.chmod(0o666)  # the sandbox's uid connects: that needs write permission on it


def _close_net(proxy: NetProxy, links: list[NetLink]) -> None:
    """The stream transport's pipes ended, the proxy's connections too, and its folder
    removed (close(), or at collection)."""
    for link in links:
        link.close()
    proxy.close()
    shutil.rmtree(proxy.path.parent, ignore_errors=True)


def _cleanup(
    engine: docker.DockerClient,
    container: Container | None,
    conn_dir: str,
    live: list[BlockingKernelClient],
    links: list[StreamLink],
    held: list[str],
) -> None:
    """Runs once: on close(), at garbage collection, or at interpreter exit."""
    for client in live:
        kernel.disconnect(client)
    live.clear()
    for link in links:
        link.close()
    links.clear()
    if container is not None:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass  # already gone
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            warnings.warn(
                f"sandbox container {container.short_id} was not removed ({error}); "
                "`sandcell gc` removes it once this process has exited",
                stacklevel=1,
            )
    for volume in held:
        try:
            volumes.remove(engine, volume)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            warnings.warn(
                f"the sandbox's volume {volume} was not removed ({error}); "
                "`sandcell gc` removes it once this process has exited",
                stacklevel=1,
            )
    ctr.remove_host_dirs(conn_dir)  # and the staging folder beside it
