"""`sandcell gc`: remove the sandbox containers a crashed process left behind."""

import sys

import click

from agent.cli.exits import EXIT_UNAVAILABLE
from sandbox import SandboxUnavailable
from sandbox.container import engine, reap_orphans


@click.command("gc")
def gc_cmd():
    """Remove sandbox containers whose owner process is gone."""
    try:
        removed = reap_orphans(engine())
    except SandboxUnavailable as error:
        click.echo(f"sandcell: {error}", err=True)
        sys.exit(EXIT_UNAVAILABLE)
    click.echo(
        f"removed {len(removed)} orphaned sandbox container(s)"
        + (": " + " ".join(removed) if removed else "")
    )
