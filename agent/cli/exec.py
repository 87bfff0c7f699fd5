"""`sandcell exec`: run code in a fresh sandbox and print the observation."""

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import click

from sandcell.agent.cli import exits, terminal
from sandcell.agent.cli.options import (
    MEMORY_MB,
    TIMEOUT_S,
    input_option,
    net_options,
    output_option,
    rich_options,
    runtime_option,
    transport_option,
    wheelhouse_option,
)
from sandcell.sandbox import DockerSandbox, Limits
from sandcell.sandbox.execution import StreamChunk
from sandcell.sandbox.render import joined, parts


def print_live(chunk: StreamChunk) -> None:
    terminal.echo(chunk.text, nl=False, err=chunk.name == "stderr")


@click.command("exec")
@input_option("A file to mount read-only at /data/<name> (repeatable).")
@click.option("--timeout", type=TIMEOUT_S, default=None, help="Cell deadline in seconds.")
@click.option("--memory", type=MEMORY_MB, default=None, help="Memory limit in MB.")
@output_option("Copy the workspace (figures, files the code wrote) to this folder.")
@rich_options
@runtime_option
@transport_option
@wheelhouse_option
@net_options
@click.option("--json", "as_json", is_flag=True, help="Print the Execution as JSON.")
@click.option("-c", "code", default=None, help="The code to run.")
@click.argument("file", required=False, type=click.File("r"))
@exits.reported()
def exec_cmd(
    inputs: tuple[Path, ...],
    timeout: float | None,
    memory: int | None,
    output: Path | None,
    rich_outputs: int,
    rich_mb: int,
    runtime: str | None,
    transport: str,
    wheelhouse: str | None,
    allow_net: tuple[str, ...],
    net_mb: int,
    as_json: bool,
    code: str | None,
    file: IO[str] | None,
) -> None:
    """Run Python in a fresh sandbox and print the observation.

    The code comes from -c CODE, from FILE, or from standard input (FILE = -).
    Exit status: 0 ran, 1 the code raised, 124 timed out, 137 the kernel died,
    2 usage error, 3 sandbox unavailable."""
    if (code is None) == (file is None):
        raise click.UsageError("give the code either with -c CODE or as FILE (- for stdin)")
    if code is not None:
        source = code
    else:
        assert file is not None  # -c or FILE, exactly one: checked above
        source = file.read()
    overrides: dict[str, Any] = {
        k: v for k, v in (("timeout_s", timeout), ("memory_mb", memory), ("runtime", runtime)) if v
    }
    limits = replace(
        Limits(),
        **overrides,
        rich_outputs=rich_outputs,
        rich_bytes=rich_mb << 20,
        wheelhouse=wheelhouse,
        transport=transport,
        allow_net=allow_net,
        net_mb=net_mb,
    )
    live = None if as_json else print_live  # stdout and stderr as the code prints them
    with DockerSandbox(limits=limits, inputs=list(inputs)) as sandbox:
        if sandbox.wheelhouse.refused:  # the operator asked for one: say why it is not there
            terminal.echo(f"sandcell: {sandbox.wheelhouse.refused}", err=True)
        ex = sandbox.run(source, on_output=live)
        saved = [output / name for name in sandbox.export(output)] if output else []
    if as_json:
        click.echo(json.dumps(ex.to_dict(), indent=1))
    else:  # the stream was shown as it came: the rest of the observation, once
        p = parts(ex, limits.observation_chars, limits.memory_mb)
        rest = joined([*p.results, p.error or "", *p.notes])
        if rest or not ex.stream:
            terminal.echo(rest or "[ran without output]")
    for path in saved:
        terminal.echo(f"saved {path}", err=True)  # names the code chose
    if ex.images and not output:
        click.echo("sandcell: the sandbox is gone; pass --output DIR to keep its files", err=True)
    sys.exit(exits.for_execution(ex))
