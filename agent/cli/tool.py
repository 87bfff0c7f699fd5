"""`sandcell tool NAME 'JSON-ARGS'`: run one tool from the shell and print its observation.

Only the tools that need no sandbox are offered here (calculator, file_metadata over the
`--input` files); exit status 0 when the observation is ok, 1 with the error otherwise."""

import sys
from pathlib import Path

import click

from agent.cli import exits
from tools import Registry, calculator_tool, file_metadata_tool


@click.command("tool")
@click.argument("name")
@click.argument("args", required=False, default="{}")
@click.option(
    "--input",
    "inputs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="An input file, seen by file_metadata as /data/<file name>. Repeatable.",
)
@exits.reported()
def tool(name: str, args: str, inputs: tuple[Path, ...]) -> None:
    """Run tool NAME with ARGS (a JSON object, e.g. '{"expression": "2^10"}')."""
    try:
        registry = Registry([calculator_tool, file_metadata_tool(inputs)])
    except ValueError as exc:  # e.g. two inputs with the same file name
        raise click.UsageError(str(exc)) from None
    obs = registry.call(name, args)
    if obs.ok:
        click.echo(obs.text)
        return
    click.echo(f"error: {obs.text}", err=True)
    sys.exit(exits.STOPPED)
