"""PID 1 of a sandcell container.

Starts the Jupyter kernel, reaps orphans, and on request kills every other process
(stop first, so a fork bomb cannot refill its slots) and starts a fresh kernel.
It makes itself non-dumpable so model code, which runs as the same uid, can neither
ptrace it nor read its memory through /proc.

Signals (sent by the host with `docker kill --signal`; the same signals sent by a
process inside the container carry its pid and are ignored):
  SIGUSR1  kill everything but PID 1, start a fresh kernel  (hard restart)
  SIGUSR2  kill everything but PID 1 and the kernel          (sweep after a timeout)
  SIGTERM  kill everything and exit
"""

import ctypes
import os
import shutil
import signal
import sys
import time

PR_SET_DUMPABLE = 4
CONNECTION_FILE = "/run/sandcell/kernel.json"
FONT_CACHE = "/opt/mplcache"
KERNEL_LOG = "/tmp/.sandcell-kernel.log"
KERNEL_CMD = [
    sys.executable,
    "-m",
    "ipykernel_launcher",
    "-f",
    CONNECTION_FILE,
    "--IPKernelApp.extensions=['sandcell_kernel']",
    "--HistoryManager.enabled=False",
]
HANDLED = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT}


def start_kernel() -> int:
    pid = os.fork()
    if pid == 0:  # child: own session so an interrupt reaches its whole process group
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.setsid()
            log = os.open(KERNEL_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
        except OSError:
            pass  # a full /tmp must not stop the kernel from starting
        os.execv(KERNEL_CMD[0], KERNEL_CMD)
    return pid


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
        shutil.copytree(FONT_CACHE, os.environ.get("MPLCONFIGDIR", "/tmp/.matplotlib"))
    except OSError:
        pass
    kernel = start_kernel()
    while True:
        info = signal.sigwaitinfo(HANDLED)
        sig = info.si_signo
        if sig != signal.SIGCHLD and info.si_pid != 0:
            continue  # sent from inside the container (model code): only the host may ask
        if sig == signal.SIGCHLD:
            if any(pid == kernel for pid, _ in reap()):
                kernel = -1  # the host notices through the heartbeat and asks for a restart
        elif sig == signal.SIGUSR1:
            kill_all({1})
            kernel = start_kernel()
        elif sig == signal.SIGUSR2:
            kill_all({1, kernel})
        else:
            kill_all({1})
            sys.exit(0)


if __name__ == "__main__":
    main()
