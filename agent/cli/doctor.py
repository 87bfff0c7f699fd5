"""`sandcell doctor`: one screen of what a run needs, each miss with how to fix it."""

from __future__ import annotations

import sys

import click

from sandcell.agent.cli import exits, terminal
from sandcell.agent.cli.options import (
    cluster_address,
    ray_option,
    runtime_option,
    transport_option,
)
from sandcell.agent.model.settings import ModelSettings


@click.command("doctor")
@click.option("--model", "model_name", help="The model name to look for at the endpoint.")
@click.option("--base-url", help="The endpoint to check [env OPENAI_BASE_URL].")
@runtime_option
@transport_option
@ray_option(
    "Check a Ray cluster instead of this host's engine (ADDRESS, else RAY_ADDRESS, else "
    "auto): the nodes offering sandboxes, and each node's engine, image and runtimes."
)
def doctor_cmd(
    model_name: str | None,
    base_url: str | None,
    runtime: str | None,
    transport: str,
    ray_address: str | None,
) -> None:
    """Check the engine, the sandbox image, the runtimes, the transport, the model endpoint,
    free disk and the cgroup limits. Exit 0 when everything a run needs holds, 3 otherwise."""
    from sandcell.agent.cli import doctor_checks as doctor

    with exits.reported():
        settings = ModelSettings.from_env(name=model_name, base_url=base_url)
        failed = 0
        found = doctor.checks(
            settings, runtime or None, endpoint_given=bool(base_url), transport=transport,
            cluster=None if ray_address is None else cluster_address(ray_address),
        )  # fmt: skip
        for check in found:
            failed += check.status == doctor.FAIL
            terminal.echo(f"{check.status:>4}  {check.name:<9} {check.detail}")
            if check.fix and check.status in (doctor.FAIL, doctor.WARN):
                terminal.echo(f"{'':>4}  {'':<9} fix: {check.fix}")
        if failed:
            click.echo(f"{failed} problem(s): fix them, then run `sandcell doctor` again")
            sys.exit(exits.UNAVAILABLE)
        click.echo("everything a run needs is here")
