"""`sandcell tool NAME 'JSON-ARGS'`: run one tool from the shell and print its observation.

Only the tools that need no sandbox are offered here (calculator, file_metadata over the
`--input` files); exit status 0 when the observation is ok, 1 with the error otherwise, 2 when
ARGS is not one JSON object. A person typed ARGS, so they are parsed strictly: the repair the
registry applies to a model's arguments would turn a typo into other arguments."""

import json
import sys
from pathlib import Path

import click

from sandcell.agent.cli import exits, terminal
from sandcell.agent.cli.options import input_option
from sandcell.sandbox.inputs import Inputs
from sandcell.tools import Registry, calculator_tool, file_metadata_tool
from sandcell.tools.registry import example_args


def typed_args(registry: Registry, name: str, text: str) -> dict:
    """ARGS as strict JSON, or a usage error saying what is wrong and where."""
    tool = registry.get(name)
    example = f"; e.g. '{example_args(tool)}'" if tool else ""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"{text!r} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            f"{example}",
            param_hint="ARGS",
        )
    if not isinstance(value, dict):
        raise click.BadParameter(
            f"{text!r} is JSON but not an object ({{...}}){example}", param_hint="ARGS"
        )
    return value


@click.command("tool")
@click.argument("name")
@click.argument("args", required=False, default="{}")
@input_option("An input file, seen by file_metadata as /data/<file name> (repeatable).")
@exits.reported()
def tool(name: str, args: str, inputs: tuple[Path, ...]) -> None:
    """Run tool NAME with ARGS (a JSON object, e.g. '{"expression": "2^10"}')."""
    registry = Registry([calculator_tool, file_metadata_tool(Inputs.from_paths(inputs))])
    outcome = registry.call(name, typed_args(registry, name, args))
    if outcome.ok:
        terminal.echo(outcome.text)
        return
    terminal.echo(f"error: {outcome.text}", err=True)
    sys.exit(exits.STOPPED)
