"""`sandcell replay TRACE`: re-run a session's recorded code in a fresh sandbox, without any
model, and report the cells whose output differs from the recording (agent.records.replay does it)."""

import difflib
import sys
from pathlib import Path

import click

from sandcell.agent.cli import exits, terminal
from sandcell.agent.records.replay import ReplayError, replay

SHOWN_DIFF_LINES = 40


@click.command("replay")
@click.argument("trace", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--input", "inputs", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="An input file that moved since the run (matched by name; repeatable).",
)  # fmt: skip
@click.option("--image", default=None, help="Sandbox image (default: the one recorded).")
@exits.reported()
def replay_cmd(trace: Path, inputs: tuple[Path, ...], image: str | None) -> None:
    """Re-run the code recorded in TRACE (a trace.jsonl) in a fresh sandbox, without a model,
    and report every cell whose output differs. Exit status: 0 all cells match, 1 some differ,
    2 TRACE is not a trace or its inputs are missing, 3 the sandbox is unavailable."""
    try:
        replayed = replay(trace, list(inputs), image)
    except ReplayError as exc:
        raise click.UsageError(str(exc)) from None
    for name in replayed.changed:
        terminal.echo(f"sandcell: warning: input {name} changed since the recorded run", err=True)
    cells = replayed.cells
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
        terminal.echo("\n".join(f"  {line}" for line in lines[:SHOWN_DIFF_LINES]))
        if len(lines) > SHOWN_DIFF_LINES:
            click.echo(f"  ... {len(lines) - SHOWN_DIFF_LINES} more diff lines")
    click.echo(
        f"{len(cells)} cells replayed, {len(cells) - len(differ)} same, {len(differ)} differ"
    )
    sys.exit(exits.STOPPED if differ else exits.OK)
