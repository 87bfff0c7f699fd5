"""`sandcell exec`: run code in a fresh sandbox and print the observation."""

import json
import sys
from dataclasses import replace

import click

from agent.cli.exits import EXIT_UNAVAILABLE, input_option
from sandbox import DockerSandbox, Execution, Limits, SandboxError, render

EXIT_OK, EXIT_RAISED, EXIT_TIMEOUT, EXIT_DIED = 0, 1, 124, 137


def exit_status(ex: Execution) -> int:
    if ex.timed_out:
        return EXIT_TIMEOUT
    if ex.restarted:
        return EXIT_DIED
    return EXIT_RAISED if ex.error else EXIT_OK


@click.command("exec")
@input_option("A file to mount read-only at /data/<name> (repeatable).")
@click.option("--timeout", type=float, default=None, help="Cell deadline in seconds.")
@click.option("--memory", type=int, default=None, help="Memory limit in MB.")
@click.option("--json", "as_json", is_flag=True, help="Print the Execution as JSON.")
@click.option("-c", "code", default=None, help="The code to run.")
@click.argument("file", required=False, type=click.File("r"))
def exec_cmd(inputs, timeout, memory, as_json, code, file):
    """Run Python in a fresh sandbox and print the observation.

    The code comes from -c CODE, from FILE, or from standard input (FILE = -).
    Exit status: 0 ran, 1 the code raised, 124 timed out, 137 the kernel died,
    2 usage error, 3 sandbox unavailable."""
    if (code is None) == (file is None):
        raise click.UsageError("give the code either with -c CODE or as FILE (- for stdin)")
    source = code if code is not None else file.read()
    overrides = {k: v for k, v in (("timeout_s", timeout), ("memory_mb", memory)) if v}
    limits = replace(Limits(), **overrides)
    try:
        with DockerSandbox(limits=limits, inputs=list(inputs)) as sandbox:
            ex = sandbox.run(source)
    except SandboxError as error:  # no engine, no image, or the container would not start
        click.echo(f"sandcell: {error}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    click.echo(
        json.dumps(ex.to_dict(), indent=1) if as_json else render(ex, limits.observation_chars)
    )
    sys.exit(exit_status(ex))
