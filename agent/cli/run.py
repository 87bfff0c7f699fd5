"""`sandcell run`: one job, no questions asked. Writes answer.md, trace.jsonl, notebook.ipynb
and everything the code wrote under /workspace/output to --output."""

import sys
from pathlib import Path

import click

from agent.cli import exits
from agent.cli.options import agent_options, build_agent, input_option
from agent.jobfiles import write_answer
from sandbox.inputs import Inputs


@click.command("run")
@click.option("--task", required=True, help="What to do, in words.")
@input_option("An input file, read-only at /data/<name> (repeatable).")
@click.option(
    "--output",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for answer.md, trace.jsonl, notebook.ipynb and output/.",
)
@agent_options
@exits.reported()
def run_cmd(task, inputs, output, opts):
    """Run one task to its end (exit 0 when answered, else non-zero with the stop reason)."""
    checked = Inputs.from_paths(inputs)  # a bad input is refused before anything is made
    output.mkdir(parents=True, exist_ok=True)
    result = build_agent(opts).run(task, inputs=checked, output_dir=output)
    write_answer(result, output)
    for warning in result.warnings:
        click.echo(f"sandcell: warning: {warning}", err=True)
    for path in result.files:
        click.echo(f"wrote {path}", err=True)
    click.echo(f"trace: {result.trace_path}\nnotebook: {result.notebook_path}", err=True)
    if result.answered:
        click.echo(result.answer)
        return
    click.echo(
        f"sandcell: stopped without an answer: {result.stop_reason}"
        + (f" ({result.detail})" if result.detail else ""),
        err=True,
    )
    sys.exit(exits.for_result(result))
