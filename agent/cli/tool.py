"""`sandcell tool NAME 'JSON-ARGS'`: run one tool from the shell and print its observation.

Only the tools that need no sandbox are offered here (calculator, file_metadata over the
`--input` files); exit status 0 when the observation is ok, 1 with the error otherwise."""

import sys
from pathlib import Path

import click

from agent.cli import exits, terminal
from agent.cli.options import input_option
from sandbox.inputs import Inputs
from tools import Registry, calculator_tool, file_metadata_tool


@click.command("tool")
@click.argument("name")
@click.argument("args", required=False, default="{}")
@input_option("An input file, seen by file_metadata as /data/<file name> (repeatable).")
@exits.reported()
def tool(name: str, args: str, inputs: tuple[Path, ...]) -> None:
    """Run tool NAME with ARGS (a JSON object, e.g. '{"expression": "2^10"}')."""
    registry = Registry([calculator_tool, file_metadata_tool(Inputs.from_paths(inputs))])
    obs = registry.call(name, args)
    if obs.ok:
        terminal.echo(obs.text)
        return
    terminal.echo(f"error: {obs.text}", err=True)
    sys.exit(exits.STOPPED)
