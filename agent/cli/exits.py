"""The one map from outcomes and errors to sandcell's exit statuses.

    0   OK           answered (run, batch), ran (exec), every cell the same (replay)
    1   STOPPED      stopped without an answer, the code raised, a tool failed, cells differ
    2   USAGE        a usage error (click's UsageError: bad flag, bad jobs file, bad trace;
                     an InputError: an input missing, not a regular file, a name taken twice)
    3   UNAVAILABLE  the sandbox is unavailable: no engine, no image, the container failed
    4   MODEL        the model endpoint is unusable: unreachable, key rejected, no such model
    124 TIMEOUT      exec: the cell passed its deadline (the status `timeout(1)` uses)
    137 DIED         exec: the kernel died and was restarted (128 + SIGKILL)
    130 INTERRUPTED  Ctrl-C (128 + SIGINT)
    143 TERMINATED   SIGTERM (128 + SIGTERM; sandcell keeps the default action, so the shell
                     reports this and the next start or `sandcell gc` reaps the containers)

Nothing heavy is imported here: the error classes load when an error is mapped, so `exec`,
`gc` and `tool` still start without the model client."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

import click

if TYPE_CHECKING:
    from agent.seams import Result
    from sandbox.execution import Execution

OK, STOPPED, USAGE, UNAVAILABLE, MODEL = 0, 1, 2, 3, 4
TIMEOUT, DIED, INTERRUPTED, TERMINATED = 124, 137, 130, 143


def _known(exc: BaseException) -> int | None:
    """The status of an error sandcell expects and words for the user; None for any other."""
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    from sandbox.inputs import InputError  # light: stdlib only

    if isinstance(exc, InputError):
        return USAGE
    from agent.seams import ModelError  # light: json_repair only

    if isinstance(exc, ModelError):
        return MODEL
    from sandbox.errors import SandboxError  # SandboxUnavailable is one

    if isinstance(exc, SandboxError):
        return UNAVAILABLE
    return None


def for_error(exc: BaseException) -> int:
    """InputError 2, ModelError 4, SandboxError (and SandboxUnavailable) 3, KeyboardInterrupt
    130; any other
    exception 1, as Python exits with for an uncaught one."""
    status = _known(exc)
    return STOPPED if status is None else status


def for_result(result: Result) -> int:
    """A run's status: 0 answered, 4 the model failed, 3 the sandbox failed, else 1."""
    from agent import stops

    if result.answered:
        return OK
    return {stops.MODEL_ERROR: MODEL, stops.SANDBOX_ERROR: UNAVAILABLE}.get(
        result.stop_reason, STOPPED
    )


def for_execution(ex: Execution) -> int:
    """One cell's status: 124 timed out, 137 the kernel died, 1 the code raised, else 0."""
    if ex.timed_out:
        return TIMEOUT
    if ex.restarted:
        return DIED
    return STOPPED if ex.error else OK


def fail(message: str, status: int) -> NoReturn:
    """Say what went wrong on stderr, as `sandcell: <message>`, and exit with status."""
    click.echo(f"sandcell: {message}", err=True)
    sys.exit(status)


@contextmanager
def reported() -> Iterator[None]:
    """Every command's body runs in this: a model or sandbox error, or Ctrl-C, ends the command
    with its one-line message on stderr and its status, without a traceback. Any other
    exception is a bug and propagates with its traceback."""
    try:
        yield
    except click.ClickException:
        raise  # click prints it and exits 2 (usage) or 1
    except (Exception, KeyboardInterrupt) as exc:
        status = _known(exc)
        if status is None:
            raise
        fail(str(exc) or "interrupted", status)
