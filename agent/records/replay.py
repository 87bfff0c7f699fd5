"""Replay: re-run a session's recorded code in a fresh sandbox, without any model, and compare
each cell's output with the recording (`sandcell replay` is the command over it)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandcell.agent.events import ATTEMPT, Event, Reset, SessionStarted, Step
from sandcell.agent.records.trace import all_inputs, read_events
from sandcell.sandbox import DockerSandbox, Execution, InputError, Inputs, Limits, Sandbox

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


class ReplayError(ValueError):
    """The recording cannot be replayed: not a trace, or its input files are gone."""


@dataclass
class Cell:
    question: int
    step: int
    code: str
    recorded: str  # normalised output as recorded
    replayed: str = ""
    reset_before: bool = False  # the session's kernel was reset (chat's /reset) before it
    renewed_before: bool = False  # ... with the whole sandbox renewed (a batch job's next attempt)
    stopped: bool = False  # as recorded: stopped at its deadline or by an interrupt ...
    restarted: bool = False  # ... and the kernel restarted to stop it
    duration_s: float = 0.0  # as recorded

    @property
    def same(self) -> bool:
        return self.recorded == self.replayed


def signature(execution: Execution) -> str:
    """What must match between a recording and a replay: output text, the cell's value, the
    error, the number of images. Memory addresses are masked; timings are not compared."""
    parts = [execution.stdout, execution.stderr, execution.text or ""]
    if execution.error:
        parts.append(f"{execution.error.name}: {execution.error.value}")
    parts.append(f"[{len(execution.images)} images]")
    if execution.timed_out or execution.restarted:
        parts.append(f"[timed out: {execution.timed_out}, restarted: {execution.restarted}]")
    text = "\n".join(p for p in parts if p)
    return "\n".join(line.rstrip() for line in _ADDRESS.sub("0x…", text).splitlines())


def recorded_cells(events: list[Event]) -> list[Cell]:
    """The python cells of a trace in order; a cell after a chat's /reset says so."""
    cells, reset, renewed = [], False, False
    for event in events:
        match event:
            case Reset(reason=reason):
                reset, renewed = True, renewed or reason == ATTEMPT
            case Step():
                for ex in event.executions():
                    cells.append(_cell(event, ex, reset))
                    cells[-1].renewed_before = renewed
                    reset = renewed = False
    return cells


def _cell(step: Step, ex: Execution, reset_before: bool) -> Cell:
    cell = Cell(
        step.question or 0, step.step or 0, ex.code, signature(ex), reset_before=reset_before
    )
    cell.stopped, cell.restarted = bool(ex.timed_out or ex.interrupted), bool(ex.restarted)
    cell.duration_s = ex.duration_s
    return cell


@dataclass
class Replayed:
    cells: list[Cell]
    changed: list[str]  # inputs whose content differs from the recorded run's (sha256)


def replay(trace: Path, inputs: Sequence[Path] = (), image: str | None = None) -> Replayed:
    """Every recorded python cell of TRACE, re-run in order in one fresh sandbox with the
    recorded limits and inputs (`inputs` overrides those by file name), resetting the kernel
    where the session did. Raises ReplayError for a file that is not a trace or inputs that
    are missing, SandboxError when no sandbox starts."""
    try:
        events = read_events(trace)
        session = next((e for e in events if isinstance(e, SessionStarted)), None)
        recorded = all_inputs(events)
    except UnicodeDecodeError:
        raise ReplayError(f"{trace} is not a trace: it is not UTF-8 text") from None
    except ValueError as exc:  # a line that is not JSON, inputs that are not paths
        raise ReplayError(f"{trace} is not a trace: {exc}") from None
    if session is None and events:
        raise ReplayError(f"{trace} is not a trace: it has no session event")
    paths = {item["name"]: Path(item["path"]) for item in recorded}
    paths.update({Path(p).name: Path(p) for p in inputs})
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ReplayError(
            f"input file(s) of the recorded run not found: {', '.join(missing)}. Pass their new "
            "location with --input PATH (matched by file name)."
        )
    try:
        now = Inputs.from_paths(paths)
    except InputError as exc:
        raise ReplayError(str(exc)) from None
    by_name = {item.name: item for item in now}  # every recorded name: `paths` had them all
    changed = [
        f"{item['name']} ({by_name[item['name']].path})"
        for item in recorded
        if item.get("sha256") and item["sha256"] != by_name[item["name"]].sha256
    ]
    known = set(Limits.__dataclass_fields__)
    recorded_limits = (session.limits if session else None) or {}
    limits = Limits(**{k: v for k, v in recorded_limits.items() if k in known})
    cells = recorded_cells(events)
    if cells:  # no sandbox needed otherwise
        image = image or (session.image if session else None)
        # staging, as a pool's (its inputs added once started): a batch job's next attempt
        # renewed its sandbox, and so does this
        with DockerSandbox(limits, image=image, staging=True) as sandbox:
            sandbox.add_inputs(now)
            rerun(sandbox, cells, inputs=now)
    return Replayed(cells, changed)


def rerun(
    sandbox: Sandbox, cells: list[Cell], *, rebuild: bool = False, inputs: Inputs | None = None
) -> list[Cell]:
    """Run the cells in order in SANDBOX, restarting its kernel where the session did. With
    `rebuild` (bringing a fresh kernel to where a session left off, not comparing), a cell
    recorded as stopped (its deadline, or an interrupt) is not run again: where its kernel
    was restarted the kernel is restarted, else it is skipped; and a cell that once ran
    longer than today's deadline allows (an `execute` given its own timeout) gets the time
    it took, twice over. Where a batch job's next attempt renewed its sandbox, SANDBOX is
    renewed (holding `inputs`). The cells not run."""
    skipped = []
    for cell in cells:
        if cell.renewed_before:
            sandbox.renew(inputs or Inputs())
        elif cell.reset_before:
            sandbox.restart()
        if rebuild and cell.stopped:
            if cell.restarted:
                sandbox.restart()
            skipped.append(cell)
            continue
        timeout = max(sandbox.limits.timeout_s, 2 * cell.duration_s + 5) if rebuild else None
        cell.replayed = signature(sandbox.run(cell.code, timeout))
    return skipped
