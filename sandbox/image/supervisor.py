"""PID 1 of a sandcell container.

Starts the Jupyter kernel and the relay the host talks to (relay.py), reaps orphans, and on
request kills every other process (stop first, so a fork bomb cannot refill its slots) and
starts a fresh kernel and relay.
It makes itself non-dumpable so model code, which runs as the same uid, can neither
ptrace it nor read its memory through /proc.

Signals (boundary.RESTART, SWEEP, STOP) are sent by the host with `docker kill --signal`;
the same signals sent by a process inside the container carry its pid and are ignored.
"""

import ctypes
import json
import os
import shutil
import signal
import sys
import time

import boundary

PR_SET_DUMPABLE = 4
CONNECTION_FILE = f"{boundary.CONNECTION_DIR}/{boundary.CONNECTION_FILE}"
INTERNAL_DIR = (
    boundary.KERNEL_DIR if os.access(boundary.KERNEL_DIR, os.W_OK) else boundary.KERNEL_DIR_FALLBACK
)
INTERNAL_FILE = f"{INTERNAL_DIR}/{boundary.CONNECTION_FILE}"
RELAY_CMD = [sys.executable, boundary.RELAY_PROGRAM, f"{INTERNAL_DIR}/k", CONNECTION_FILE]
KERNEL_CMD = [
    sys.executable,
    "-m",
    boundary.KERNEL_MODULE,
    "-f",
    INTERNAL_FILE,
    f"--IPKernelApp.extensions=['{boundary.KERNEL_EXTENSION}']",
    "--HistoryManager.enabled=False",
]
HANDLED = {signal.SIGCHLD, boundary.RESTART, boundary.SWEEP, boundary.STOP, signal.SIGINT}


def spawn(cmd: list[str], oom_score_adj: int) -> int:
    pid = os.fork()
    if pid == 0:  # child: own session so an interrupt reaches its whole process group
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
        try:  # our /proc files belong to root while we are non-dumpable, as PID 1 made us
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(oom_score_adj))  # under memory pressure the kernel goes first
        except OSError:
            pass
        os.execv(cmd[0], cmd)
    return pid


def start() -> tuple[int, int]:
    """A fresh relay and kernel. The kernel binds its sockets in INTERNAL_DIR."""
    os.makedirs(INTERNAL_DIR, mode=0o700, exist_ok=True)
    try:  # every session starts with the folder a job hands back
        os.makedirs(boundary.OUTPUT, exist_ok=True)
    except OSError:
        pass  # a full or missing workspace must not stop the kernel
    with open(CONNECTION_FILE) as f:
        info = json.load(f)
    info["ip"] = f"{INTERNAL_DIR}/k"
    with open(INTERNAL_FILE, "w") as f:
        json.dump(info, f)
    return spawn(RELAY_CMD, 500), spawn(KERNEL_CMD, 1000)


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


def live_pids(keep: set[int]) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in keep:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            pids.append(int(name))
    return pids


def kill_all(keep: set[int], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pids = live_pids(keep)
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        reap()
        time.sleep(0.005)
    reap()


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:  # the font cache lives in the read-only image; matplotlib wants it writable
        shutil.copytree(boundary.FONT_CACHE, os.environ.get("MPLCONFIGDIR", "/tmp/.matplotlib"))
    except OSError:
        pass
    relay, kernel = start()
    while True:
        info = signal.sigwaitinfo(HANDLED)
        sig = info.si_signo
        if sig != signal.SIGCHLD and info.si_pid != 0:
            continue  # sent from inside the container (model code): only the host may ask
        if sig == signal.SIGCHLD:
            if any(pid == kernel for pid, _ in reap()):
                kernel = -1  # the host notices through the heartbeat and asks for a restart
        elif sig == boundary.RESTART:
            kill_all({1})
            relay, kernel = start()
        elif sig == boundary.SWEEP:
            kill_all({1, kernel, relay})
        else:
            kill_all({1})
            sys.exit(0)


if __name__ == "__main__":
    main()
