"""`sandcell` as a shell runs it, for tests and the bench: the command line (this interpreter,
`-m sandcell.agent.cli`, so PYTHONPATH and the venv carry over), a run to its end, a running process,
a pseudo-terminal, and a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pexpect

SANDCELL = [sys.executable, "-m", "sandcell.agent.cli"]


def sandcell(
    *args: str, timeout: float = 120, text: bool = True, **run_kwargs: Any
) -> subprocess.CompletedProcess:
    """`sandcell ARGS` to its end, stdout and stderr captured (as text unless text=False);
    run_kwargs go to subprocess.run (env, input, stdin, check...)."""
    return subprocess.run(
        [*SANDCELL, *args], capture_output=True, text=text, timeout=timeout, **run_kwargs
    )


def sandcell_process(*args: str, **popen_kwargs: Any) -> subprocess.Popen:
    """`sandcell ARGS` started, stdout and stderr piped as text unless popen_kwargs say
    otherwise. Read the pipes (communicate) or pass DEVNULL: a full pipe blocks the child."""
    popen_kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **popen_kwargs}  # fmt: skip
    return subprocess.Popen([*SANDCELL, *args], **popen_kwargs)


def sandcell_terminal(*args: str, **spawn_kwargs: Any) -> pexpect.spawn:
    """`sandcell ARGS` on a real pseudo-terminal; spawn_kwargs go to pexpect.spawn."""
    import pexpect  # only the terminal tests need it

    return pexpect.spawn(SANDCELL[0], [*SANDCELL[1:], *args], **spawn_kwargs)


def free_port() -> int:
    """A loopback port nothing listens on right now (another process may take it later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
