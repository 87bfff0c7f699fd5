"""`sandcell gc`: remove the sandbox containers and volumes a crashed process left behind."""

import click

from sandcell.agent.cli import exits
from sandcell.sandbox.container import REMOVAL_WAIT_S, engine, reap_orphans


@click.command("gc")
@exits.reported()
def gc_cmd() -> None:
    """Remove sandbox containers (and their input volumes) whose owner process is gone."""
    removed = reap_orphans(engine(), wait_s=REMOVAL_WAIT_S)
    click.echo(
        f"removed {len(removed)} orphaned sandbox container(s)"
        + (": " + " ".join(removed) if removed else "")
    )
