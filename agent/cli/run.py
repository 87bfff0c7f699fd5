"""`sandcell run`: one job, no questions asked. Writes answer.md, trace.jsonl, notebook.ipynb,
and what the code made: /workspace/output to output/, charts to figures/, every other file
it wrote to workspace/. On a terminal the steps show as they happen (--quiet: not)."""

import sys
from pathlib import Path
from typing import Any

import click

from sandcell.agent import stops
from sandcell.agent.cli import exits, terminal
from sandcell.agent.cli.options import (
    agent_options,
    build_agent,
    check_options,
    check_output_folder,
    expect_option_value,
    input_option,
    output_folder,
    output_option,
    overwrite_option,
    task_text,
)
from sandcell.agent.jobs.job_files import write_job_files
from sandcell.sandbox.inputs import Inputs


@click.command("run")
@click.option("--task", required=True, callback=task_text, help="What to do, in words.")
@input_option("An input file, read-only at /data/<name> (repeatable).")
@output_option(
    "Folder for answer.md, trace.jsonl, notebook.ipynb, output/, figures/, workspace/.",
    required=True,
)
@overwrite_option
@click.option("--quiet", is_flag=True, help="Do not show the steps as they happen.")
@check_options
@agent_options
@exits.reported()
def run_cmd(
    task: str,
    inputs: tuple[Path, ...],
    output: Path,
    overwrite: bool,
    quiet: bool,
    expect: tuple[str, ...],
    check_retries: int,
    opts: dict[str, Any],
) -> None:
    """Run one task to its end (exit 0 when answered, else non-zero with the stop reason;
    Ctrl-C or SIGTERM keep what was done and exit 130 or 143). With --expect the answer is
    accepted only once those outputs pass their schemas (else exit 1, checks_failed)."""
    checks = expect_option_value(expect)  # a bad schema is refused before anything starts
    opts = {**opts, "check_retries": check_retries}
    checked = Inputs.from_paths(inputs)  # a bad input is refused before anything is made
    check_output_folder(output, overwrite)
    on_event = None
    if not quiet and sys.stderr.isatty():
        from rich.console import Console

        from sandcell.agent.cli.console import EventPrinter

        on_event = EventPrinter(
            Console(stderr=True, highlight=False), stream_tokens=False, show_answer=False
        )
    agent = build_agent(opts, on_event)  # model and engine checked before --overwrite clears
    output_folder(output, overwrite)
    exits.keep_details_in(output)
    result = agent.run(task, inputs=checked, output_dir=output, expect=checks)
    write_job_files(result, checked, output)
    for warning in result.warnings:
        terminal.echo(f"sandcell: warning: {warning}", err=True)
    for path in result.files:
        terminal.echo(f"wrote {path}", err=True)  # names the code chose
    if result.checks is not None:
        said = "passed" if result.checks["passed"] else "FAILED"
        terminal.echo(f"checks: {said} (see {output / 'answer.md'})", err=True)
    click.echo(f"trace: {result.trace_path}\nnotebook: {result.notebook_path}", err=True)
    if result.answer is not None and result.answered:  # answered: it has one
        terminal.echo(result.answer)
        return
    if result.stop_reason in (stops.INTERRUPTED, stops.TERMINATED):
        terminal.echo(f"sandcell: {result.detail}; what was done is kept in {output}", err=True)
    else:
        said = f"stopped without an answer: {result.stop_reason}" + (
            f" ({result.detail})" if result.detail else ""
        )
        if result.stop_reason == stops.SANDBOX_ERROR:
            said = exits.with_doctor(said)
        terminal.echo(f"sandcell: {said}", err=True)
    sys.exit(exits.for_result(result))
