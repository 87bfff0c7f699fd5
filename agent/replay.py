"""Replay: re-run a session's recorded code in a fresh sandbox, without any model, and compare
each cell's output with the recording (`sandcell replay` is the command over it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agent.trace import read_trace
from sandbox import DockerSandbox, Execution, Limits

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


def recorded_cells(events: list[dict]) -> list[Cell]:
    cells = []
    for event in events:
        if event.get("type") != "step":
            continue
        for obs in event.get("observations", []):
            if obs.get("tool") == "python" and obs.get("execution"):
                ex = Execution.from_dict(obs["execution"])
                cells.append(
                    Cell(event.get("question", 0), event.get("step", 0), ex.code, signature(ex))
                )
    return cells


def recorded_inputs(session: dict) -> dict[str, Path]:
    """/data name -> host path of each input of the recorded run. A trace lists an input as
    its path (named by its base name) or as {"name": ..., "path": ..., ...}."""
    named = {}
    for item in session.get("inputs", []):
        if isinstance(item, dict):
            path = Path(item["path"])
            named[item.get("name") or path.name] = path
        else:
            named[Path(item).name] = Path(item)
    return named


def replay(trace: Path, inputs: list[Path] = (), image: str | None = None) -> list[Cell]:
    """Every recorded python cell of TRACE, re-run in order in one fresh sandbox with the
    recorded limits and inputs (`inputs` overrides those by file name). Raises ReplayError
    for a file that is not a trace or inputs that are missing, SandboxError when no sandbox
    starts."""
    try:
        events = read_trace(trace)
    except UnicodeDecodeError:
        raise ReplayError(f"{trace} is not a trace: it is not UTF-8 text") from None
    except ValueError as exc:  # a line that is not JSON
        raise ReplayError(str(exc)) from None
    session = next((e for e in events if e.get("type") == "session"), {})
    by_name = recorded_inputs(session)
    by_name.update({Path(p).name: Path(p) for p in inputs})
    missing = [str(p) for p in by_name.values() if not p.is_file()]
    if missing:
        raise ReplayError(
            f"input file(s) of the recorded run not found: {', '.join(missing)}. Pass their new "
            "location with --input PATH (matched by file name)."
        )
    known = set(Limits.__dataclass_fields__)
    limits = Limits(**{k: v for k, v in session.get("limits", {}).items() if k in known})
    cells = recorded_cells(events)
    if not cells:
        return cells  # no sandbox needed
    with DockerSandbox(limits, by_name, image or session.get("image")) as sandbox:
        for cell in cells:
            cell.replayed = signature(sandbox.run(cell.code))
    return cells
