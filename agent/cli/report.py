"""`sandcell report DIR`: DIR/report.html and DIR/report.md made again from DIR/results.jsonl
(a batch writes both as each job ends; this is for a batch killed mid-write, or an older one)."""

from pathlib import Path

import click

from sandcell.agent.cli import exits
from sandcell.agent.jobs.batch_report import ReportError, rebuild


@click.command("report")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@exits.reported()
def report_cmd(folder: Path) -> None:
    """Rebuild the batch report of DIR (the --output folder of `sandcell batch`)."""
    try:
        html, md = rebuild(folder)
    except ReportError as error:
        raise click.UsageError(str(error)) from None
    click.echo(f"wrote {html}\nwrote {md}")
