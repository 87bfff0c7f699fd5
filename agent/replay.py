"""`sandcell replay TRACE`: re-run a session's recorded code in a fresh sandbox, without any
model, and report the cells whose output differs from the recording."""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from agent.cli.exits import EXIT_UNAVAILABLE
from agent.session import prepare
from agent.trace import read_trace
from sandbox import DockerSandbox, Execution, Limits, SandboxError

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


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


def replay(trace: Path, inputs: list[Path] = (), image: str | None = None) -> list[Cell]:
    events = read_trace(trace)
    session = next((e for e in events if e.get("type") == "session"), {})
    by_name = {p.name: p for p in map(Path, session.get("inputs", []))}
    by_name.update({Path(p).name: Path(p) for p in inputs})
    missing = [str(p) for p in by_name.values() if not p.is_file()]
    if missing:
        raise click.ClickException(
            f"input file(s) of the recorded run not found: {', '.join(missing)}. Pass their new "
            "location with --input PATH (matched by file name)."
        )
    known = set(Limits.__dataclass_fields__)
    limits = Limits(**{k: v for k, v in session.get("limits", {}).items() if k in known})
    cells = recorded_cells(events)
    with DockerSandbox(limits, list(by_name.values()), image or session.get("image")) as sandbox:
        prepare(sandbox)
        for cell in cells:
            cell.replayed = signature(sandbox.run(cell.code))
    return cells


@click.command("replay")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--input", "inputs", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="An input file that moved since the run (matched by name; repeatable).",
)  # fmt: skip
@click.option("--image", default=None, help="Sandbox image (default: the one recorded).")
def replay_cmd(trace: Path, inputs: tuple[Path, ...], image: str | None) -> None:
    """Re-run the code recorded in TRACE (a trace.jsonl) in a fresh sandbox, without a model,
    and report every cell whose output differs. Exit status: 0 all cells match, 1 some differ,
    3 the sandbox is unavailable."""
    try:
        cells = replay(trace, list(inputs), image)
    except ValueError as exc:  # not a trace
        raise click.ClickException(str(exc)) from None
    except SandboxError as exc:
        click.echo(f"sandcell: {exc}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    if not cells:
        click.echo(f"{trace}: no python cells recorded; nothing to replay")
        return
    differ = [(i, c) for i, c in enumerate(cells, 1) if not c.same]
    for i, cell in differ:
        click.echo(f"cell {i} (question {cell.question}, step {cell.step}) differs:")
        diff = difflib.unified_diff(
            cell.recorded.splitlines(),
            cell.replayed.splitlines(),
            "recorded",
            "replayed",
            lineterm="",
        )
        lines = list(diff)
        click.echo("\n".join(f"  {line}" for line in lines[:40]))
        if len(lines) > 40:
            click.echo(f"  ... {len(lines) - 40} more diff lines")
    click.echo(
        f"{len(cells)} cells replayed, {len(cells) - len(differ)} same, {len(differ)} differ"
    )
    sys.exit(1 if differ else 0)
