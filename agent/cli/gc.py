"""`sandcell gc`: remove the sandbox containers a crashed process left behind."""

import click

from agent.cli import exits
from sandbox.container import engine, reap_orphans


@click.command("gc")
@exits.reported()
def gc_cmd():
    """Remove sandbox containers whose owner process is gone."""
    removed = reap_orphans(engine())
    click.echo(
        f"removed {len(removed)} orphaned sandbox container(s)"
        + (": " + " ".join(removed) if removed else "")
    )
