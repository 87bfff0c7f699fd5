"""Docker side of a sandbox: the sealed container, its labels, orphan reaping, and file
operations through `docker exec` (the workspace is a tmpfs, which Docker's archive API
cannot see)."""

import contextlib
import functools
import io
import os
import shutil
import socket
import struct
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
from docker.models.containers import Container
from docker.types import LogConfig, Ulimit

from sandcell.sandbox import boundary, landing
from sandcell.sandbox.boundary import (
    HELPER_LABEL,
    HOST_DIR_LABEL,
    LABEL,
    OWNER_LABEL,
    SESSION_LABEL,
    WORKSPACE,
)
from sandcell.sandbox.checkpoint import restore_into
from sandcell.sandbox.errors import SandboxError, SandboxUnavailable
from sandcell.sandbox.kernel import CONN_PREFIX
from sandcell.sandbox.limits import Limits

DEFAULT_IMAGE = os.environ.get("SANDCELL_IMAGE", "sandcell-sandbox:latest")
REMOVAL_WAIT_S = 30  # a removal another process began, waited for
# The sandbox's uid must differ from the host user's: the same uid would own the host-side
# connection folder and could undo its seal. The image's user is 1000; 1001 is its stand-in.
SANDBOX_UID = 1001 if getattr(os, "getuid", lambda: 0)() == 1000 else 1000  # no getuid: Windows
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
# The stream transport's bridge (sandbox/stream.py): a uid of its own, the sandbox's group.
BRIDGE_UID = SANDBOX_UID + boundary.BRIDGE_UID_OFFSET
BRIDGE_USER = f"{BRIDGE_UID}:{SANDBOX_UID}"
# The host's own commands (the file helper) run as the sandbox's uid, so they read and write
# every workspace file, but in a group model code is not in: the kernel then refuses model
# code the helper's /proc/<pid>/fd (ptrace access needs uid AND gid equal), so it cannot open
# the helper's stdout and write into what the host reads. gVisor's runsc (2022-12) does not
# check that: there the host's unpacking (landing.py) is what holds.
HELPER_USER = f"{SANDBOX_UID}:{SANDBOX_UID + boundary.HELPER_GID_OFFSET}"


ENGINE_TIMEOUT_S = 60  # one call to the engine (a container's removal can take a while)
PING_TIMEOUT_S = 5  # the first: an engine that is stopped or stuck is said so at once


def engine() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=PING_TIMEOUT_S)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise SandboxUnavailable(
            f"no Docker engine answers ({error}). Start one (`sudo systemctl start docker`, "
            "Docker Desktop, or from a clone `make engine`) and check that your user may use "
            "it (`docker info`)."
        ) from None
    client.api.timeout = ENGINE_TIMEOUT_S
    return client


_podman: dict[str, bool] = {}  # per engine address, for this process


def is_podman(client: docker.DockerClient) -> bool:
    """Whether the engine is Podman's Docker-compatible API (its version names the component),
    which takes some options its own way (see _tmpfs, ulimits)."""
    address = str(client.api.base_url)
    if address not in _podman:
        components = client.version().get("Components") or []
        _podman[address] = any(c.get("Name") == "Podman Engine" for c in components)
    return _podman[address]


def check_image(client: docker.DockerClient, image: str) -> None:
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise SandboxUnavailable(
            f"the sandbox image {image} is missing. Build it with `sandcell image build`."
        ) from None


# What gVisor's runsc needs to host this sandbox: its own (empty) network namespace, and
# host Unix sockets in bind mounts: the relay creates its ipc sockets in the connection
# folder, and after a kernel restart the next relay unlinks them, which needs `open` too.
RUNSC_ARGS = ("--network=none", "--host-uds=all")
ENGINE_HINT = (
    "`sandcell doctor` shows how to register gVisor (from a clone, `make engine RUNTIME=runsc` "
    "installs and registers it; root on Debian)"
)


# Under gVisor the pids cgroup holds the Sentry, not the sandbox's processes: its host threads
# and the ptrace platform's stubs (a host process per address space, a thread in each per Sentry
# thread that ran it) grow with use, whatever the sandbox's own count. 32 subprocesses and then
# 4 reads at once took 806; at the 256 the sandbox asked for, the Sentry could not make a thread
# and the whole sandbox ended. So there `pids` is held by gVisor's own kernel, which counts the
# sandbox's processes and threads against RLIMIT_NPROC (its uids are its own), and the cgroup
# stays as a bound on the host's share: a fork bomb held at 256 took 1404 (a margin measured,
# not a worst case). Not under runc: there RLIMIT_NPROC counts all the host's processes of the uid.
RUNSC_SENTRY_HOST_TASKS = 1024
RUNSC_HOST_TASKS_PER_PID = 8


def host_pids_limit(limits: Limits, gvisor: bool) -> int:
    """The container's pids cgroup limit: the sandbox's own count, or under gVisor a bound on
    the Sentry's host threads and stubs."""
    if not gvisor:
        return limits.pids
    return RUNSC_SENTRY_HOST_TASKS + limits.pids * RUNSC_HOST_TASKS_PER_PID


def check_runtime(client: docker.DockerClient, runtime: str | None) -> bool:
    """The engine knows `runtime` (None: its default), and a runsc one has the arguments the
    sandbox needs; without them the kernel's sockets never appear and a start waits 60 s.
    True when the runtime is gVisor's."""
    if runtime not in (None, "runc") and is_podman(client):
        raise SandboxUnavailable(
            f"Podman's Docker API takes no runtime: {runtime} cannot be asked of it (its "
            "containers run under its own). Leave --runtime out, or use a Docker engine with "
            "runsc for gVisor."
        )
    return runtime_is_gvisor(client.info(), runtime)


def runtime_is_gvisor(info: dict, runtime: str | None) -> bool:
    """check_runtime's verdict from the engine's `docker info`. An engine whose default is
    runsc runs a sandbox that asks for none under gVisor too: its limits must say so."""
    known = info.get("Runtimes") or {}
    if runtime is not None and runtime not in known:
        raise SandboxUnavailable(
            f"the Docker engine has no runtime {runtime!r} (it has: {', '.join(sorted(known))}). "
            f"{ENGINE_HINT}, or see the README's security model."
        )
    name = runtime or info.get("DefaultRuntime")
    entry = known.get(name) or {}
    if os.path.basename(entry.get("path", "")) != "runsc":
        return False
    args = entry.get("runtimeArgs") or []
    uds = [a.split("=", 1)[1] for a in args if a.lstrip("-").startswith("host-uds=")]
    if not any(a.lstrip("-") == "network=none" for a in args) or "all" not in uds:
        raise SandboxUnavailable(
            f"the runtime {name!r} (gVisor) is registered with {args or 'no arguments'}; the "
            f"sandbox needs {' '.join(RUNSC_ARGS)}. {ENGINE_HINT}."
        )
    return True


def preflight(
    image: str | None = None, runtime: str | None = None, transport: str = "auto"
) -> None:
    """Raise SandboxUnavailable now if no sandbox could start (no engine, no image, a runtime
    the engine lacks, the ipc transport asked of an engine that cannot see this machine's
    folders): a front end says so before it asks a model anything, though the container
    starts later."""
    from sandcell.sandbox.transport import choose

    client = engine()
    check_image(client, image or DEFAULT_IMAGE)
    check_runtime(client, runtime)
    choose(client, transport, image or DEFAULT_IMAGE)


def owner(pid: int | None = None) -> str:
    """The owner label's value for a process on this host (by default this one)."""
    return f"{this_host()}:{pid or os.getpid()}"


@functools.cache
def this_host() -> str:
    """This machine as the owner label names it: its name and its machine id, since two
    laptops of one name may share a remote engine, and each judges only its own processes."""
    try:
        machine = Path("/etc/machine-id").read_text().strip()[:12]
    except OSError:
        machine = ""
    if not machine:  # none (macOS, Windows, some containers): one made once, kept
        kept = Path(os.environ.get("SANDCELL_CACHE") or Path.home() / ".cache" / "sandcell")
        kept = kept / "machine-id"
        try:
            machine = kept.read_text().strip()
        except OSError:
            machine = uuid.uuid4().hex[:12]
            with contextlib.suppress(OSError):
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(machine)
    return f"{socket.gethostname()}/{machine}"


def start(
    client: docker.DockerClient,
    image: str,
    limits: Limits,
    label: str,
    conn_dir: str,
    volumes: dict,
    gvisor: bool = False,
    checkpoint: Path | None = None,
    streamed: bool = False,
) -> Container:
    """Start a sealed container whose PID 1 (the supervisor) starts the kernel; or, from a
    paused sandbox's `checkpoint`, restore it (the kernel as it was). `volumes`: its mounts
    (bind_mounts, or the stream transport's data volume); `streamed`: reached through the
    engine's API (sandbox/stream.py), its relay's sockets on a tmpfs of its own."""
    check_image(client, image)  # and DockerSandbox has checked limits.runtime
    environment = {
        boundary.OUTPUT_CHARS_ENV: str(limits.output_bytes),
        boundary.SPILL_BYTES_ENV: str(limits.spill_bytes),
        boundary.RICH_OUTPUTS_ENV: str(limits.rich_outputs),
        boundary.RICH_BYTES_ENV: str(limits.rich_bytes),
    }
    if limits.allow_net:  # every client that reads the proxy variables goes to the forwarder
        proxy = f"http://127.0.0.1:{boundary.NET_PORT}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            environment[name] = environment[name.lower()] = proxy
        # the container's own loopback is its own (a server a cell starts), not the host's
        environment["NO_PROXY"] = environment["no_proxy"] = "localhost,127.0.0.1,::1"
        environment[boundary.NET_ENV] = "1"
    podman = is_podman(client)
    tmpfs = _tmpfs(limits, podman)
    if streamed:
        environment[boundary.STREAMED_ENV] = "1"
        # the relay's sockets: its uid makes them, the bridge (its group) reaches them; the
        # bridge's connection files are in a volume of the caller's (key_volume)
        tmpfs[boundary.CONNECTION_DIR] = f"size=1m,{_owned(podman)},mode=0770,nosuid,nodev,noexec"
        if limits.allow_net:  # the forwarder's dock, where the host's pipes wait (net_link.py)
            tmpfs[boundary.NET_DIR] = f"size=64k,{_owned(podman)},mode=0770,nosuid,nodev,noexec"
    options = dict(
        image=image,
        network_mode="none",
        read_only=True,
        tmpfs=tmpfs,
        volumes=volumes,
        mem_limit=f"{limits.memory_mb}m",
        memswap_limit=f"{limits.memory_mb}m",  # equal to memory: no swap
        nano_cpus=int(limits.cpus * 1e9),
        pids_limit=host_pids_limit(limits, gvisor),
        ulimits=ulimits(limits, gvisor, podman),
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        user=SANDBOX_USER,
        environment=environment,
        log_config=LOG_CONFIG,
        labels=labels(label) | {HOST_DIR_LABEL: conn_dir},
        runtime=limits.runtime,
        stop_signal=boundary.STOP.name,
    )
    return _created(client, options, conn_dir, checkpoint)


LOG_CONFIG = LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"})


# RLIMIT_NPROC under runc on Podman. Under runc it counts every process of the uid on the
# host, all sandboxes together, so it is no sandbox's own bound (the pids cgroup is) and stays
# the engine's on Docker; but Podman starts no container whose nofile and nproc it fills in
# itself (1048576, above what it may grant; it lowers its own to 32768).
PODMAN_NPROC = 32768


def ulimits(limits: Limits, gvisor: bool, podman: bool = False) -> list[Ulimit]:
    """The open files limit, and the processes limit under gVisor (the sandbox's own count,
    see host_pids_limit) and on Podman (both explicit on every container it runs)."""
    nofile = [Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files)]
    if gvisor:
        return nofile + [Ulimit(name="nproc", soft=limits.pids, hard=limits.pids)]
    if podman:
        return nofile + [Ulimit(name="nproc", soft=PODMAN_NPROC, hard=PODMAN_NPROC)]
    return nofile


def labels(label: str, helper: bool = False) -> dict[str, str]:
    """What every container and volume of a sandbox carries (a helper container: its own
    kind label instead of the sandbox's): the reaper reads it."""
    return {HELPER_LABEL if helper else LABEL: "1", OWNER_LABEL: owner(), SESSION_LABEL: label}


def helper_options(client: docker.DockerClient, label: str) -> dict:
    """The options of a short-lived helper container of a sandbox (it fills its inputs): no
    network, no capabilities, small limits, the sandbox's labels."""
    small = Limits(memory_mb=256, pids=64)
    return dict(
        network_mode="none",
        read_only=True,
        mem_limit=f"{small.memory_mb}m",
        memswap_limit=f"{small.memory_mb}m",
        pids_limit=small.pids,
        ulimits=ulimits(small, gvisor=False, podman=is_podman(client)),
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        log_config=LOG_CONFIG,
        labels=labels(label, helper=True),
    )


def _created(
    client: docker.DockerClient, options: dict, conn_dir: str, saved: Path | None
) -> Container:
    """The container made and started, or restored from the checkpoint `saved` (a failed
    restore is the PauseError it raised); nothing left behind when it fails."""
    container = None
    try:
        container = client.containers.create(**options)
        if saved is None:
            container.start()
        else:
            restore_into(client, container.id, saved)
    # e.g. a mount refused, a runtime that fails, an engine that stopped answering
    except (docker.errors.APIError, requests.exceptions.RequestException, SandboxError) as error:
        if container is not None:
            container.remove(force=True)
        remove_host_dirs(conn_dir)
        if saved is not None:
            raise
        raise SandboxError(
            f"the sandbox container would not start: {getattr(error, 'explanation', None) or error}. "
            "Check `docker info` (runtimes, storage) and the input paths."
        ) from None
    return container


def _tmpfs(limits: Limits, podman: bool = False) -> dict[str, str]:
    """The writable places, each size-capped in memory (the root filesystem is read-only),
    none executable (Docker's default; Podman's needs saying)."""
    owned = _owned(podman)
    places = {
        "/tmp": f"size={limits.tmp_mb}m,mode=1777,nosuid,nodev,noexec",
        WORKSPACE: f"size={limits.workspace_mb}m,{owned},mode=0755,nosuid,nodev,noexec",
        # the kernel's own sockets and connection file, reached only by the relay
        boundary.KERNEL_DIR: f"size=1m,{owned},mode=0700,nosuid,nodev,noexec",
    }
    if podman:  # its API puts a writable, executable, unbounded tmpfs on /var/tmp of its own
        places["/var/tmp"] = "ro,size=64k,nosuid,nodev,noexec"
    return places


def _owned(podman: bool) -> str:
    """The tmpfs option that makes the sandbox's user own a mount: Podman 4.3 refuses `uid=`
    and has `U` (the container's user) instead, which Docker refuses."""
    return "U" if podman else f"uid={SANDBOX_UID},gid={SANDBOX_UID}"


def bind_mounts(
    conn_dir: str, inputs: dict[str, Path], staging_dir: Path | None, wheelhouse: Path | None
) -> dict:
    """The bind mounts: the connection folder, its connection file again read-only, each
    input file read-only (or the staging folder of a pool sandbox), and the wheelhouse
    read-only: sandcell's own folder of indexed wheels (wheelhouse.offer checked it)."""
    volumes = {conn_dir: {"bind": boundary.CONNECTION_DIR, "mode": "rw"}}
    # The connection file is mounted over itself read-only: while a restart unseals the
    # folder, code still running cannot rename another file over it (a mount point) and so
    # choose the next kernel's key. The folder's sticky bit does that under runc, but
    # gVisor's runsc (2022-12) lets a rename in a sticky folder replace the host's file.
    connection_file = os.path.join(conn_dir, boundary.CONNECTION_FILE)
    volumes[connection_file] = {
        "bind": f"{boundary.CONNECTION_DIR}/{boundary.CONNECTION_FILE}",
        "mode": "ro",
    }
    for name, path in inputs.items():  # one file at a time, read-only: never a whole folder
        volumes[str(path)] = {"bind": f"{boundary.DATA}/{name}", "mode": "ro"}
    if staging_dir is not None:  # a pool sandbox: its inputs are placed here on acquire
        volumes[str(staging_dir)] = {"bind": boundary.DATA, "mode": "ro"}
    if wheelhouse is not None:
        volumes[str(wheelhouse)] = {"bind": boundary.WHEELHOUSE, "mode": "ro"}
    return volumes


def staging_path(conn_dir: str) -> Path:
    """The private folder (0700) beside a connection folder that holds a pool sandbox's
    input staging folder (`make_staging`)."""
    return Path(conn_dir + "-data")


def make_staging(conn_dir: str) -> Path:
    """Where a pool sandbox's inputs are placed (hard links to the user's files), mounted
    read-only at /data. It sits in a 0700 folder of the host user's, so other host accounts
    can neither list nor enter it; the sandbox's user reaches it through the mount alone,
    which never walks the private folder (the engine, as root, resolved the path)."""
    private = staging_path(conn_dir)
    private.mkdir(mode=0o700)
    inside = private / "inputs"
    inside.mkdir(mode=0o755)
    return inside


def remove_host_dirs(conn_dir: str) -> None:
    """The connection folder and the pool's input staging folder beside it. Only paths that
    sandcell made (temp dir, its prefix) are touched, whatever a label says."""
    base = Path(tempfile.gettempdir()).resolve()
    for path in (Path(conn_dir), staging_path(conn_dir)):
        if path.parent.resolve() != base or not path.name.startswith(CONN_PREFIX):
            continue
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o700)  # unseal (for the owner alone), else its files cannot go
            shutil.rmtree(path, ignore_errors=True)


def reap_orphans(client: docker.DockerClient, wait_s: float = 0) -> list[str]:
    """Remove sandbox containers (and then their input volumes) whose owner process on this
    host is gone. A removal another process began is waited for up to `wait_s` (what `gc`
    and a starting server promise, "none left", holds); a sandbox starting does not wait on
    a stuck one. The short ids of the containers and the names of the volumes removed."""
    removed = []
    host = this_host()
    # The plain list call: no per-container inspect that could race with a removal.
    listed = [
        client.api.containers(all=True, filters={"label": kind}) for kind in (LABEL, HELPER_LABEL)
    ]
    for entry in listed[0] + listed[1]:
        labels = entry.get("Labels") or {}
        owner_host, _, pid = labels.get(OWNER_LABEL, ":").partition(":")
        if owner_host == host and pid.isdigit() and alive(int(pid)):
            continue
        if owner_host != host and entry.get("State") == "running":
            continue  # started from another machine sharing this engine: not ours to judge
        try:
            client.api.remove_container(entry["Id"], force=True)
            removed.append(entry["Id"][:12])
            remove_host_dirs(labels.get(HOST_DIR_LABEL, ""))
        except docker.errors.APIError as error:
            if error.status_code == 409:  # another process is removing it
                if wait_s:
                    _wait_removed(client, entry["Id"], wait_s)
            elif error.status_code != 404:  # 404: gone already
                raise
    return removed + reap_orphan_volumes(client)


def reap_orphan_volumes(client: docker.DockerClient) -> list[str]:
    """Remove the input volumes (the stream transport's) of sandboxes whose owner process on
    this host is gone; one still mounted (its container not yet removed) is left for later."""
    removed = []
    host = this_host()
    for volume in client.api.volumes(filters={"label": LABEL}).get("Volumes") or []:
        labels = volume.get("Labels") or {}
        owner_host, _, pid = labels.get(OWNER_LABEL, ":").partition(":")
        if owner_host != host or (pid.isdigit() and alive(int(pid))):
            continue  # another machine's (a shared engine), or its owner lives
        try:
            client.api.remove_volume(volume["Name"])
            removed.append(volume["Name"])
        except docker.errors.APIError as error:
            if error.status_code not in (404, 409):  # gone already, or still in use
                raise
    return removed


def _wait_removed(client: docker.DockerClient, container_id: str, seconds: float) -> None:
    """Wait for a removal begun elsewhere, so a caller's "reaped" holds once this returns."""
    try:
        client.api.wait(container_id, timeout=seconds, condition="removed")
    except docker.errors.NotFound:
        pass  # removed already
    except (docker.errors.APIError, requests.exceptions.RequestException):
        pass  # still going after the wait: `sandcell gc` later finds what is left


def alive(pid: int) -> bool:
    """Whether a process of this host has this pid (no signal is sent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


EXEC_OUT_BYTES = 16 << 20  # stdout of a `docker exec`, unless the caller allows more
EXEC_ERR_BYTES = 64 << 10  # its stderr: an error message, never more


# Under gVisor (runsc 2022-12) what Python writes to a `docker exec` stdout past its first
# 64 KiB is lost (the host pipe takes short writes); through a pipe inside the sandbox and
# `cat` it all arrives. The command's own exit status is kept (dash has no pipefail).
THROUGH_CAT = 'exec 4>&1; s=$( { { "$@"; echo $? >&3; } | cat >&4; } 3>&1 ); exit "$s"'


def exec_in(
    container: Container,
    cmd: list[str],
    stdin: bytes | None = None,
    max_out: int = EXEC_OUT_BYTES,
    through_cat: bool = False,
) -> tuple[int, bytes, bytes]:
    """Run cmd as HELPER_USER; feed stdin; read at most max_out bytes of stdout and
    EXEC_ERR_BYTES of stderr. Under gVisor model code can write into the helper's output
    (same uid), so both are bounded whatever the helper meant to send."""
    if through_cat:
        cmd = ["sh", "-c", THROUGH_CAT, "sh", *cmd]
    api = container.client.api
    try:
        exec_id = api.exec_create(
            container.id, cmd, stdin=stdin is not None, user=HELPER_USER, workdir=WORKSPACE
        )["Id"]
        sock = api.exec_start(exec_id, socket=True)
    except docker.errors.APIError:
        check_running(container)  # it stopped (a fork bomb ends a gVisor sandbox): said so
        raise
    raw = sock._sock  # the plain socket: needed to half-close after stdin
    stream = upgraded_stream(sock)
    out, err = bytearray(), bytearray()
    try:
        if stdin is not None:
            raw.sendall(stdin)
        raw.shutdown(socket.SHUT_WR)
        for stream_id, payload in exec_frames(stream):
            target = out if stream_id == 1 else err
            target += payload
            if len(out) > max_out or len(err) > EXEC_ERR_BYTES:
                del out[max_out:]
                del err[EXEC_ERR_BYTES:]
                break
    except TimeoutError:  # the engine's client timeout: the sandbox no longer answers
        check_running(container)
        raise SandboxError(
            f"the sandbox did not answer `{cmd[0]}` within {api.timeout:g} s"
        ) from None
    finally:
        stream.close()  # it holds the socket open (makefile's reference) until then
        raw.close()
    code = api.exec_inspect(exec_id).get("ExitCode")
    return (code if code is not None else -1), bytes(out), bytes(err)


# `sock`: docker's exec socket, a socket.SocketIO that docker hangs its `_response` on
KEEPALIVE_IDLE_S = 60  # a remote engine's connection idle between cells: kept alive


def exec_stream(container: Container, command: list[str], user: str) -> tuple[socket.socket, Any]:
    """`command` started in `container` by `docker exec`, stdin open, as `user`, in /: its
    socket (shut for writing, the command's stdin ends) and its output as read through the
    response's reader (upgraded_stream; exec_frames parses it). Idle for hours is fine; over
    TCP kept alive. APIError or RequestException when the engine will not."""
    api = container.client.api
    exec_id = api.exec_create(container.id, command, stdin=True, user=user, workdir="/")["Id"]
    sock = api.exec_start(exec_id, socket=True)
    raw: socket.socket = getattr(sock, "_sock", sock)
    raw.settimeout(None)
    keep_alive(raw)
    return raw, upgraded_stream(sock)


def keep_alive(raw: socket.socket) -> None:
    """TCP keepalives on a remote engine's connection: a NAT or a load balancer between would
    drop it, idle between cells, without a word. Nothing for a Unix socket."""
    if raw.family not in (socket.AF_INET, socket.AF_INET6):
        return
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; macOS has TCP_KEEPALIVE
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 15)


def upgraded_stream(sock: Any) -> io.BufferedReader:
    """The stream after the engine's `101 UPGRADED`, read through the buffered reader that
    parsed its headers: frames that came in the same read as those headers wait in its
    buffer, and the plain socket no longer has them. Read from the socket, a fast command's
    whole output was lost under load (an export came back empty with exit code 0; the same
    bug in docker-py: docker/docker-py#3332)."""
    return sock._response.raw._fp.fp


def exec_frames(stream: io.BufferedReader) -> Iterator[tuple[int, bytes]]:
    """Docker's multiplexed exec stream: (stream id, payload) of each frame as it arrives
    (an 8-byte header, stream and size, then the payload)."""
    header = struct.Struct(">BxxxL")
    buffer = bytearray()  # deleting from its front is cheap: a large output is read in O(n)
    while chunk := stream.read1(1 << 16):
        buffer += chunk
        while len(buffer) >= header.size:
            stream_id, size = header.unpack_from(buffer)
            if len(buffer) < header.size + size:
                break
            yield stream_id, bytes(buffer[header.size : header.size + size])
            del buffer[: header.size + size]


def extract_tar(data: bytes, host_dir: Path, cap: int) -> list[str]:
    """Unpack a tar made inside the sandbox. It is hostile input (model code can write into
    the helper's stdout): only a plain tar is read (no decompression: a small bz2 could
    unpack to any size), its files may add up to `cap` bytes, the data filter refuses links
    out, devices and absolute paths, and it is unpacked into a private staging folder from
    which only the regular files on disk move to host_dir, each checked to stay inside: the
    names the archive gave are never used. The files placed, relative to host_dir."""
    host_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=host_dir))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            members = [m for m in archive.getmembers() if m.isfile() or m.isdir()]
            total = sum(m.size for m in members)
            if total > cap:
                raise SandboxError(f"the workspace archive holds {total} bytes, over {cap}")
            archive.extractall(staging, members=members, filter="data")
        placed = []
        for name in landing.files_in(staging):
            landing.move_inside(staging / name, host_dir, name)
            placed.append(name)
        return placed
    except (tarfile.TarError, EOFError, OSError) as error:
        raise SandboxError(f"the workspace could not be copied: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


STOPPING_WAIT_S = 2.0  # a container the engine is ending reads as running for a moment


def send_signal(container: Container, signal_name: str) -> None:
    """A signal to the supervisor (PID 1). A container that stops as it is sent (under gVisor a
    fork bomb ends the whole sandbox) makes the engine refuse the signal while its state may
    still read running: its state is watched up to STOPPING_WAIT_S, so a stop is said as the
    stop it is, with its likely cause, and never as a signal the sandbox did not take."""
    try:
        container.kill(signal=signal_name)
    except docker.errors.APIError as error:
        deadline = time.monotonic() + STOPPING_WAIT_S
        while True:
            check_running(container)  # stopped or gone: that error
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        raise SandboxError(
            f"the sandbox container did not take {signal_name}: {error.explanation or error}"
        ) from None


def check_running(container: Container) -> None:
    try:
        container.reload()
    except docker.errors.NotFound:
        raise SandboxError("the sandbox container is gone (removed from outside?)") from None
    if container.status != "running":
        raise SandboxError(f"the sandbox container stopped ({stop_cause(container)})")


def stop_cause(container: Container) -> str:
    """Why a container stopped, as far as its state tells: out of memory (under gVisor the
    memory limit holds the whole sandbox: running out ends it all), or its exit status with
    the likely cause of each."""
    state = container.attrs.get("State", {})
    said = f"status {container.status}"
    if state.get("OOMKilled"):
        return f"{said}, out of memory"
    code = state.get("ExitCode")
    if code in (137, -9) or state.get("Error"):
        # killed from outside or by its runtime: under gVisor, a fork bomb or a process
        # count past the limit ends the whole sandbox
        return (
            f"{said}, exit {code}: killed, from outside or by its runtime; under gVisor a fork "
            "bomb ends the whole sandbox"
        )
    return f"{said}, exit {code}" if code is not None else said
