"""The one map from outcomes and errors to sandcell's exit statuses.

    0   OK           answered (run, batch), ran (exec), every cell the same (replay)
    1   STOPPED      stopped without an answer, the code raised, a tool failed, cells differ
    2   USAGE        a usage error (click's UsageError: bad flag, bad jobs file, bad trace;
                     an InputError: an input missing, not a regular file, a name taken twice)
    3   UNAVAILABLE  the sandbox is unavailable: no engine, no image, the container failed
    4   MODEL        the model endpoint is unusable: unreachable, key rejected, no such model
    124 TIMEOUT      exec: the cell passed its deadline (the status `timeout(1)` uses)
    137 DIED         exec: the kernel died and was restarted (128 + SIGKILL)
    70  INTERNAL     a bug: one line says so, the traceback goes to a file (`--debug` shows it)
    130 INTERRUPTED  Ctrl-C (128 + SIGINT)
    143 TERMINATED   SIGTERM (128 + SIGTERM), handled like Ctrl-C: work so far is kept and
                     every container is removed

Nothing of the model client is imported here, so `exec`, `gc` and `tool` still start without
`openai` (any `sandcell` import loads the package's front door, which never loads it)."""

from __future__ import annotations

import datetime as dt
import logging
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from sandcell.agent.seams import Terminated

if TYPE_CHECKING:
    from sandcell.agent.seams import RunResult
    from sandcell.sandbox.execution import Execution

OK, STOPPED, USAGE, UNAVAILABLE, MODEL = 0, 1, 2, 3, 4
INTERNAL, TIMEOUT, DIED, INTERRUPTED, TERMINATED = 70, 124, 137, 130, 143


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


class OneLine(logging.Formatter):
    """Library warnings (a retried request, a tool that failed) as one `sandcell:` line: the
    traceback a log record may carry is for --debug, not for the user's terminal."""

    def format(self, record: logging.LogRecord) -> str:
        from sandcell.agent.cli.terminal import for_terminal, is_terminal

        said = for_terminal(record.getMessage(), is_terminal(sys.stderr))  # may quote a server
        if record.exc_info and record.exc_info[1] is not None:  # kept in a file, named here
            return f"sandcell: {said}; details in {_save_details(record.exc_info[1])}"
        return f"sandcell: {said}"


def setup_logging(debug: bool) -> Callable[[], None]:
    """sandcell's own loggers (sandcell.*; the root is left alone) to stderr, as OneLine says;
    returns what puts them back as they were (a command run in-process, by tests)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter() if debug else OneLine())
    level = logging.DEBUG if debug else logging.WARNING
    return take_over(logging.getLogger("sandcell"), [handler], level)


def close_telemetry() -> None:
    """The command's traces piped to their exporting process as it ends (when it made any)."""
    telemetry = sys.modules.get("sandcell.agent.telemetry")
    if telemetry is not None:
        telemetry.close()


def take_over(
    logger: logging.Logger, handlers: list[logging.Handler], level: int
) -> Callable[[], None]:
    """`logger`'s records to `handlers` alone, from `level`; returns what puts it back as it
    was (a command run in-process, by tests)."""
    before = logger.handlers[:], logger.propagate, logger.level
    logger.handlers[:] = handlers
    logger.propagate = False
    logger.setLevel(level)

    def restore() -> None:
        logger.handlers[:], logger.propagate = before[0], before[1]
        logger.setLevel(before[2])

    return restore


def handle_signals() -> None:
    """Every command: SIGTERM ends it as Ctrl-C does (containers removed, work kept), and
    Ctrl-C (SIGINT) ends it even when it was started with SIGINT ignored, as every `cmd &` of
    a script or CI job is (Python then leaves it ignored, and a SIGINT sent to the command
    would be lost). The handlers before come back when the command ends (a command run
    in-process, by tests)."""
    term = signal.signal(signal.SIGTERM, _terminate)
    interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)
    context = click.get_current_context()
    context.call_on_close(lambda: signal.signal(signal.SIGTERM, term))
    context.call_on_close(lambda: signal.signal(signal.SIGINT, interrupt))


class Debug:
    """`sandcell --debug`: unexpected errors show their traceback instead of a file name."""

    enabled = False
    details_dir: Path | None = None  # where a command keeps its files (else the temp folder)


def keep_details_in(folder: Path) -> None:
    """A command that has a folder of its own keeps an internal error's details there."""
    Debug.details_dir = folder


def for_error(exc: BaseException) -> int:
    """InputError 2, ModelError 4, SandboxError (and SandboxUnavailable) 3, Terminated 143,
    KeyboardInterrupt 130: the errors sandcell expects and words for the user. Any other
    exception is a bug: 70."""
    if isinstance(exc, Terminated):
        return TERMINATED
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    from sandcell.sandbox.inputs import InputError

    if isinstance(exc, InputError):
        return USAGE
    from sandcell.agent.seams import ModelError

    if isinstance(exc, ModelError):
        return MODEL
    from sandcell.sandbox.errors import SandboxError  # SandboxUnavailable is one

    if isinstance(exc, SandboxError):
        return UNAVAILABLE
    return INTERNAL


def for_result(result: RunResult) -> int:
    """A run's status: 0 answered, 4 the model failed, 3 the sandbox failed, 130/143 it was
    interrupted (Ctrl-C, SIGTERM), else 1."""
    from sandcell.agent import stops

    if result.answered:
        return OK
    statuses = {
        stops.MODEL_ERROR: MODEL,
        stops.SANDBOX_ERROR: UNAVAILABLE,
        stops.INTERRUPTED: INTERRUPTED,
        stops.TERMINATED: TERMINATED,
    }
    return statuses.get(result.stop_reason, STOPPED)


def for_execution(ex: Execution) -> int:
    """One cell's status: 124 timed out, 137 the kernel died, 1 the code raised, else 0."""
    if ex.timed_out:
        return TIMEOUT
    if ex.restarted:
        return DIED
    return STOPPED if ex.error else OK


DOCTOR = "`sandcell doctor` checks what a sandbox needs"


def with_doctor(message: str) -> str:
    """A sandbox-unavailable message (exit 3) pointing to `sandcell doctor`."""
    return message if "sandcell doctor" in message else f"{message.rstrip()} ({DOCTOR})"


def fail(message: str, status: int) -> NoReturn:
    """Say what went wrong on stderr, as `sandcell: <message>`, and exit with status; exit 3
    points to `sandcell doctor`."""
    from sandcell.agent.cli import terminal

    if status == UNAVAILABLE:
        message = with_doctor(message)
    terminal.echo(f"sandcell: {message}", err=True)  # an error may quote a server or a cell
    sys.exit(status)


@contextmanager
def reported() -> Iterator[None]:
    """Every command's body runs in this: a model or sandbox error, Ctrl-C or SIGTERM ends the
    command with its one-line message on stderr and its status, without a traceback. Any other
    exception is a bug: one line names it and the file holding its traceback, exit 70."""
    try:
        yield
    except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise  # click prints it and exits 2 (usage) or 1
    except (Exception, KeyboardInterrupt) as exc:
        status = for_error(exc)
        if status != INTERNAL:
            fail(str(exc) or "interrupted", status)
        if Debug.enabled:
            raise
        fail(
            f"internal error: {type(exc).__name__}: {exc}; details in {_save_details(exc)}",
            INTERNAL,
        )


def _save_details(exc: BaseException) -> Path:
    folder = Debug.details_dir or Path(tempfile.gettempdir())
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"sandcell-error-{stamp}.txt"
        path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
    except OSError:  # the folder is gone or full: the temp folder then
        handle, name = tempfile.mkstemp(prefix=f"sandcell-error-{stamp}-", suffix=".txt")
        with open(handle, "w", encoding="utf-8") as f:
            f.write("".join(traceback.format_exception(exc)))
        path = Path(name)
    return path
