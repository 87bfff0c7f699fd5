"""PID 1 of a sandcell container.

Starts the Jupyter kernel and the relay the host talks to (relay.py), reaps orphans, and on
request kills every other process (stop first, so a fork bomb cannot refill its slots) and
starts a fresh kernel and relay; on RENEW it also empties every folder a job can write to,
for the next job of a batch.

From the first RENEW on, kernels are forked from this process, which then imports ipykernel,
pandas, numpy and most of matplotlib once (and never runs model code): a renewed kernel costs
its own start only, not those imports. A sandbox never renewed pays nothing for this: its
kernels start with exec, as they do where an import fails.
From then on it also serves a job's output checks (checks.py): it listens on
boundary.CHECKS_SOCKET, bound as it starts so no other process can take the name, and forks a
checker per request, with pandas and pandera loaded already, for the host's own commands only
(the helper group; model code is not in it).
It makes itself non-dumpable so model code, which runs as the same uid, can neither
ptrace it nor read its memory through /proc.

Before a pause (boundary.QUIESCE) it stops the relay, the one process holding sockets in the
host's folder, so gVisor can checkpoint the container; once restored (boundary.NEW_RELAY) it
starts a new relay for the same kernel.

Signals (boundary.RESTART, RENEW, SWEEP, QUIESCE, NEW_RELAY, STOP) are sent by the host with `docker kill --signal`;
the same signals sent by a process inside the container carry its pid and are ignored.
"""

import ctypes
import fcntl
import importlib
import json
import os
import shutil
import signal
import socket
import sys
import time

import boundary

PR_SET_DUMPABLE = 4
# Reached over the stream transport (boundary.STREAMED_ENV), the connection file comes from
# the host's bridge, into a folder of its own; otherwise from the host's bind-mounted folder.
STREAMED = os.environ.get(boundary.STREAMED_ENV) == "1"
CONNECTION_FILE = (
    f"{boundary.KEY_DIR if STREAMED else boundary.CONNECTION_DIR}/{boundary.CONNECTION_FILE}"
)
INTERNAL_DIR = (
    boundary.KERNEL_DIR if os.access(boundary.KERNEL_DIR, os.W_OK) else boundary.KERNEL_DIR_FALLBACK
)
INTERNAL_FILE = f"{INTERNAL_DIR}/{boundary.CONNECTION_FILE}"
RELAY_CMD = [sys.executable, boundary.RELAY_PROGRAM, f"{INTERNAL_DIR}/k", INTERNAL_FILE]
BRIDGE_UID = os.getuid() + boundary.BRIDGE_UID_OFFSET
KERNEL_ARGS = [
    "-f",
    INTERNAL_FILE,
    f"--IPKernelApp.extensions=['{boundary.KERNEL_EXTENSION}']",
    "--HistoryManager.enabled=False",
]
KERNEL_CMD = [sys.executable, "-m", boundary.KERNEL_MODULE, *KERNEL_ARGS]
# --allow-net: the forwarder the proxy variables name (no decision there: the host's proxy
# decides; model code could reach its socket itself and gain nothing)
NET_CMD = [sys.executable, boundary.NET_PROGRAM, str(boundary.NET_PORT), boundary.NET_SOCKET]
NET_RESTARTS = 5  # a forwarder killed more often than this stays down until the next kernel
HANDLED = {
    signal.SIGCHLD,
    boundary.RESTART,
    boundary.RENEW,
    boundary.SWEEP,
    boundary.STOP,
    boundary.QUIESCE,
    boundary.NEW_RELAY,
    signal.SIGINT,
    signal.SIGIO,  # a connection to the checks socket
}
# What a kernel would import anyway, loaded here once. Importing opens no socket or file that
# a fork would share; numpy's OpenBLAS starts its threads, which it stops and restarts
# around a fork by itself (pthread_atfork). A forked kernel's matrix product is tested.
PRELOAD = (
    "zmq",
    "relay",
    "ipykernel.kernelapp",
    "ipykernel.debugger",  # debugpy, imported as a kernel starts: a tenth of a CPU-second
    # and the rest of what a kernel imports as it starts
    "IPython.core.completerlib",
    "IPython.core.debugger",
    "IPython.core.oinspect",
    "IPython.core.pylabtools",
    "IPython.extensions.storemagic",
    "tornado.platform.asyncio",
    "numpy",
    "pandas",
    # not pyplot nor the inline backend: the kernel extension patches pyplot as it is first
    # imported, and the inline backend hooks into the shell as it is imported
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    boundary.KERNEL_EXTENSION,
)
CHECKER = ("yaml", "pandera.pandas", "pandera.io.pandas_io", "pandera.errors", "checks")
ACCEPTS_AT_ONCE = 8  # connections to the checks socket taken per SIGIO
# The host's helpers (file reads, checks) run in this group; model code cannot join it
HELPER_GID = os.getgid() + boundary.HELPER_GID_OFFSET
# Every place model code can leave files for a later job: the tmpfs mounts, the shared-memory
# and POSIX message-queue folders, the kernel's own folder, and the host's connection folder
# (writable to the sandbox while the host has it unsealed for a restart).
JOB_DIRS = (boundary.WORKSPACE, "/tmp", "/dev/shm", "/dev/mqueue", INTERNAL_DIR)


def imported(name: str) -> bool:
    """Import the module `name` into this process; False (and said) if it fails."""
    try:
        importlib.import_module(name)
    except Exception as error:  # an image without pandas still runs kernels
        print(f"supervisor: preload of {name} failed: {error!r}", file=sys.stderr)
        return False
    return True


def preload() -> bool:
    """Import PRELOAD; False (kernels then start with exec) if the kernel's own modules fail."""
    essential = ("zmq", "relay", "ipykernel.kernelapp", boundary.KERNEL_EXTENSION)
    return all(imported(name) or name not in essential for name in PRELOAD)  # stops at one


def preload_checker(listener: socket.socket | None) -> None:
    """Import CHECKER, then serve checks on listener; where an import fails, checks.py keeps
    checking in a process of its own."""
    if listener is None or not all(imported(name) for name in CHECKER):
        return
    listener.setblocking(False)
    fcntl.fcntl(listener, fcntl.F_SETOWN, os.getpid())  # SIGIO here as a connection comes
    fcntl.fcntl(listener, fcntl.F_SETFL, fcntl.fcntl(listener, fcntl.F_GETFL) | os.O_ASYNC)
    listener.listen(8)


def checks_socket() -> socket.socket | None:
    """boundary.CHECKS_SOCKET bound (not listening yet): the name is ours from the start."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(boundary.CHECKS_SOCKET)
    except OSError as error:
        print(f"supervisor: no checks socket: {error!r}", file=sys.stderr)
        listener.close()
        return None
    return listener


def serve_checks(listener: socket.socket) -> None:
    """A checker for each waiting connection of the host's checks.py; any other is closed.
    At most ACCEPTS_AT_ONCE: model code connecting without end must not keep this process
    from the host's signals (SIGIO, raised again for the rest, comes after all of them)."""
    for _ in range(ACCEPTS_AT_ONCE):
        try:
            conn, _ = listener.accept()
        except OSError:  # none left (or the listener is not listening: no preload)
            return
        with conn:
            _, uid, gid = boundary.peer_credentials(conn)
            if uid == os.getuid() and gid == HELPER_GID:
                fork_checker(conn)
    signal.raise_signal(signal.SIGIO)  # blocked: pending, taken after the host's signals


def fork_checker(conn: socket.socket) -> None:
    """Check one request in a fork of this process. The fork stays non-dumpable (model code,
    the same uid, can neither ptrace it nor read its memory) and is killed by SIGALRM at
    CHECKS_SECONDS. A fork that fails (the pids or memory limit, which model code can reach)
    closes the connection: checks.py then checks in a process of its own."""
    try:
        pid = os.fork()
    except OSError as error:
        print(f"supervisor: no checker: {error!r}", file=sys.stderr)
        return
    if pid != 0:
        return
    try:
        keep = conn.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never the container's stdout: that is Docker's log
            os.dup2(null, fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        signal.alarm(boundary.CHECKS_SECONDS)
        conn.setblocking(True)
        checks = sys.modules["checks"]
        request = checks.read_all(conn, checks.REQUEST_BYTES)
        reply = checks.answer(json.loads(request)) | {"checker": "supervisor"}
        conn.sendall(json.dumps(reply).encode())
    finally:
        os._exit(0)


def run_relay() -> None:
    sys.argv = RELAY_CMD[1:]
    sys.modules["relay"].main()


def run_kernel() -> None:
    """What `python -m ipykernel_launcher` does, in a process forked from this one."""
    sys.argv = [boundary.KERNEL_MODULE, *KERNEL_ARGS]
    sys.path.pop(0)  # this script's folder; the launcher removes the cwd it would have had
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # numpy does not reseed at fork: every kernel would draw alike
        numpy.random.seed()
    sys.modules["ipykernel.kernelapp"].launch_new_instance()


def retitle(words: list[str]) -> None:
    """Write as many of `words` as fit over this process's command line, in place: a forked
    kernel or relay shows what it is (`ps`, /proc/<pid>/cmdline; the host looks for a live
    kernel that way). The command line ends where the environment begins, on the stack."""
    with open("/proc/self/cmdline", "rb") as f:
        old = f.read()
    env = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")[0]
    if not env or ctypes.string_at(env - len(old), len(old)) != old:
        return  # not the layout expected: keep the old title rather than write blind
    title = b""
    for word in words:
        if len(title) + len(word) + 1 > len(old):
            break
        title += word.encode() + b"\0"
    ctypes.memmove(env - len(old), title.ljust(len(old), b"\0"), len(old))


def spawn(cmd: list[str], oom_score_adj: int, run=None) -> int:
    """Start cmd (or, when run is given, call run in a fork of this process)."""
    pid = os.fork()
    if pid == 0:  # child: own session so an interrupt reaches its whole process group
        if run is not None:  # nothing of PID 1 but its imports goes to the child
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            retitle(cmd)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            log = os.open(boundary.KERNEL_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError:
            log = null  # a full /tmp must not stop the kernel from starting
        os.dup2(null, 0)
        os.dup2(log, 1)  # never the container's stdout: that is Docker's log
        os.dup2(log, 2)
        os.closerange(3, max(null, log) + 1)  # exec would close them; a fork must
        try:  # our /proc files belong to root while we are non-dumpable, as PID 1 made us
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(oom_score_adj))  # under memory pressure the kernel goes first
        except OSError:
            pass
        if run is None:
            os.execv(cmd[0], cmd)
        try:
            run()
        finally:
            os._exit(0)
    return pid


def connection(new_key: bool, seen: list) -> dict:
    """The next kernel's connection file. Over the stream transport the host's bridge writes
    it after the host's signal: with `new_key` (the first start, a renewal) this waits
    (KEY_WAIT_S) for a file other than the last one read, noted in `seen`."""
    deadline = time.monotonic() + boundary.KEY_WAIT_S
    while STREAMED:
        try:
            st = os.stat(CONNECTION_FILE)
            now = (st.st_ino, st.st_ctime_ns)
        except FileNotFoundError:
            now = None
        if now is not None and (not new_key or now not in seen):
            seen[:] = [now]
            break
        if time.monotonic() > deadline:
            sys.exit("supervisor: no connection file came from the host's bridge")
        time.sleep(0.01)
    with open(CONNECTION_FILE) as f:
        return json.load(f)


def start(forked: bool, info: dict) -> tuple[int, int]:
    """A fresh relay and kernel. The kernel binds its sockets in INTERNAL_DIR."""
    os.makedirs(INTERNAL_DIR, mode=0o700, exist_ok=True)
    try:  # every session starts with the folder a job hands back
        os.makedirs(boundary.OUTPUT, exist_ok=True)
    except OSError:
        pass  # a full or missing workspace must not stop the kernel
    info = dict(info, ip=f"{INTERNAL_DIR}/k")
    with open(INTERNAL_FILE, "w") as f:
        json.dump(info, f)
    return start_relay(forked), spawn(KERNEL_CMD, 1000, run_kernel if forked else None)


def start_relay(forked: bool) -> int:
    return spawn(RELAY_CMD, 500, run_relay if forked else None)


def start_net() -> int:
    """The forwarder, when the host gave this sandbox a proxy; -1 when it did not."""
    return spawn(NET_CMD, 500) if os.environ.get(boundary.NET_ENV) == "1" else -1


def stop_relay(relay: int) -> None:
    """The relay killed and reaped, then its socket files removed from the host's folder
    (unsealed by the host for this): their absence tells the host nothing in the container
    holds a host socket any more."""
    if relay <= 0:  # stopped already (a second QUIESCE): kill(-1) would end everything
        return
    try:
        os.kill(relay, signal.SIGKILL)
        os.waitpid(relay, 0)
    except (OSError, ChildProcessError):
        pass  # gone already
    for port in boundary.CHANNELS.values():
        try:
            os.unlink(f"{boundary.CONNECTION_DIR}/{boundary.socket_name(port)}")
        except OSError:
            pass


def reap() -> list[tuple[int, int]]:
    ended = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, status))


def live_pids(keep: set[int], spare_helpers: bool = False) -> list[int]:
    """Every process but `keep` and the host's bridge (another uid: never ours to kill)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            uid, gid = real_ids(name)
            if uid == BRIDGE_UID or (spare_helpers and gid == HELPER_GID):
                continue
        except (OSError, IndexError):
            continue
        if state != b"Z":
            pids.append(int(name))
    return pids


def real_ids(pid: str) -> tuple[int, int]:
    """A process's real uid and gid."""
    ids = {}
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith((b"Uid:", b"Gid:")):
                ids[line[:3]] = int(line.split()[1])
    return ids.get(b"Uid", -1), ids.get(b"Gid", -1)


def kill_all(keep: set[int], seconds: float = 10.0, spare_helpers: bool = False) -> bool:
    """True once no process but `keep` is left (and, with spare_helpers, the host's helpers:
    a file read or a check the host ran while the sweep went on); False if some still live
    at the deadline."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pids = live_pids(keep, spare_helpers)
        if not pids:
            reap()
            return True
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        reap()
        time.sleep(0.005)
    reap()
    return not live_pids(keep, spare_helpers)


def copy_font_cache() -> None:
    try:  # the font cache lives in the read-only image; matplotlib wants it writable
        shutil.copytree(boundary.FONT_CACHE, os.environ.get("MPLCONFIGDIR", "/tmp/.matplotlib"))
    except OSError:
        pass


def unlock(top: str) -> None:
    """Every folder under top readable and writable by us, its owner: model code may have
    taken its own rights away (chmod 0) to keep a file from being removed."""
    stack = [top]
    while stack:
        path = stack.pop()
        try:
            os.chmod(path, 0o700)
            with os.scandir(path) as entries:
                stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
        except OSError:
            pass  # not ours (a mount point) or gone: empty() checks what is left


def empty(folder: str, keep: tuple[str, ...] = ()) -> None:
    """Remove everything in folder but `keep`; raise OSError if anything else is left."""
    if not os.path.isdir(folder):
        return
    for entry in os.scandir(folder):
        if entry.name in keep:
            continue
        if entry.is_dir(follow_symlinks=False):
            unlock(entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass
    left = sorted(set(os.listdir(folder)) - set(keep))
    if left:
        raise OSError(f"{folder} still holds {left[:3]}")


def remove_ipc() -> None:
    """System V shared memory, semaphores and message queues outlive their processes: remove
    every one (all are ours: nothing else runs in the container's IPC namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    for kind, remove in (
        ("shm", lambda i: libc.shmctl(i, ipc_rmid, None)),
        ("sem", lambda i: libc.semctl(i, 0, ipc_rmid)),
        ("msg", lambda i: libc.msgctl(i, ipc_rmid, None)),
    ):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue  # gVisor may not list them
        for row in rows:
            if remove(int(row.split()[1])) != 0:
                raise OSError(ctypes.get_errno(), f"the {kind} segment {row.split()[1]} stays")


def wipe() -> None:
    """Leave nothing of a job: its files everywhere it could write, and its IPC objects."""
    os.chmod(boundary.WORKSPACE, 0o755)  # its root is ours: model code may have chmodded it
    if INTERNAL_DIR == boundary.KERNEL_DIR:
        os.chmod(INTERNAL_DIR, 0o700)
    for folder in JOB_DIRS:
        empty(folder)
    empty(boundary.CONNECTION_DIR, keep=(boundary.CONNECTION_FILE,))
    if os.environ.get(boundary.NET_ENV) == os.environ.get(boundary.STREAMED_ENV) == "1":
        os.chmod(boundary.NET_DIR, 0o770)  # the forwarder's dock: a tmpfs model code may write
        empty(boundary.NET_DIR)
    remove_ipc()
    for name in os.listxattr(boundary.WORKSPACE):
        os.removexattr(boundary.WORKSPACE, name)
    copy_font_cache()


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)  # before any import can start a thread
    copy_font_cache()
    listener, seen = checks_socket(), []
    preloaded = forked = False
    relay, kernel = start(forked, connection(True, seen))
    net, restarts = start_net(), 0
    while True:
        info = signal.sigwaitinfo(HANDLED)
        sig = info.si_signo
        if sig == signal.SIGIO:  # from anyone: serve_checks judges each connection itself
            if listener is not None:
                serve_checks(listener)
            continue
        if sig != signal.SIGCHLD and info.si_pid != 0:
            continue  # sent from inside the container (model code): only the host may ask
        if sig == signal.SIGCHLD:
            ended = [pid for pid, _ in reap()]
            if kernel in ended:
                kernel = -1  # the host notices through the heartbeat and asks for a restart
            if net > 0 and net in ended:  # ended by model code (same uid): back, a few times
                restarts += 1
                net = start_net() if restarts <= NET_RESTARTS else -1
        elif sig == boundary.RESTART:
            kill_all({1})
            relay, kernel = start(forked, connection(False, seen))
            net, restarts = start_net(), 0
        elif sig == boundary.RENEW:
            # No process of the last job may see the next job's files: if one outlives the
            # kill, or anything it wrote stays, the container ends (the host then says so).
            if not kill_all({1}):
                sys.exit("supervisor: a process outlived the kill; the sandbox cannot be renewed")
            try:
                wipe()
            except OSError as error:
                sys.exit(f"supervisor: the sandbox cannot be renewed: {error}")
            if not preloaded:  # after wipe(): matplotlib reads the font cache it copied back
                preloaded, forked = True, preload()
                if forked:
                    preload_checker(listener)
            relay, kernel = start(forked, connection(True, seen))
            net, restarts = start_net(), 0  # the last job's connections went with the kill
        elif sig == boundary.QUIESCE:  # a pause: the host checkpoints the container next
            stop_relay(relay)
            relay = -1
        elif sig == boundary.NEW_RELAY:  # restored from a checkpoint: the kernel is as it was
            if relay == -1:
                relay = start_relay(forked)
        elif sig == boundary.SWEEP:  # a timed-out cell's strays: the host's helpers are not
            kill_all({1, kernel, relay, net}, spare_helpers=True)
        else:
            kill_all({1})
            sys.exit(0)


if __name__ == "__main__":
    main()
