"""`sandcell image`: the sandbox image in use, and `sandcell image build`, which makes it from
the sources this installed package carries (no clone needed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sandcell.agent.cli import exits
from sandcell.agent.cli.options import runtime_option
from sandcell.sandbox import image_build
from sandcell.sandbox.container import DEFAULT_IMAGE, check_runtime, engine

if TYPE_CHECKING:
    from rich.progress import Progress as Bar
    from rich.progress import TaskID


@click.group("image", invoke_without_command=True)
@click.pass_context
def image_cmd(ctx: click.Context) -> None:
    """Show the sandbox image in use (env SANDCELL_IMAGE), its hash and whether it is current
    for this version. Exit 0 when it is, 3 when it is missing or out of date."""
    if ctx.invoked_subcommand is not None:
        return
    with exits.reported():
        state = image_build.inspect(engine(), DEFAULT_IMAGE)
        click.echo(state.describe())
        if state.present:
            click.echo(f"  build hash {state.hash or 'unknown'}, created {state.created}")
        sys.exit(exits.OK if state.current else exits.UNAVAILABLE)


class Progress:
    """The build's progress: a bar over the Dockerfile's steps on a terminal, plain lines
    elsewhere (a log, CI)."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.bar: Bar | None = None
        self.task: TaskID | None = None
        self.started = time.monotonic()

    def say(self, line: str) -> None:
        self.console.print(f"sandcell: {line}", markup=False, highlight=False, soft_wrap=True)

    def step(self, i: int, n: int, what: str) -> None:
        what = " ".join(what.split())
        if not self.console.is_terminal:
            self.say(f"step {i}/{n}: {what[:100]}")
            return
        if self.bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("building"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.description}"), console=self.console, transient=True,
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task("", total=n)
        assert self.task is not None  # made with the bar
        self.bar.update(self.task, completed=i - 1, description=what[:60])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@image_cmd.command("build")
@click.option("--base", metavar="IMAGE", help="A base image with python3 already on the engine "
              "(e.g. python:3.11-slim) [default: Debian bookworm made with debootstrap].")  # fmt: skip
@click.option(
    "--extra",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="REQUIREMENTS",
    help="A requirements file of more packages for the image (downloaded here as wheels).",
)
@click.option("--no-cache", is_flag=True, help="Build every layer anew (the wheels stay cached).")
@runtime_option
def build_cmd(base: str | None, extra: Path | None, no_cache: bool, runtime: str | None) -> None:
    """Build the sandbox image (env SANDCELL_IMAGE names it) from this sandcell's sources,
    offline once the wheels are cached; tagged with its content hash too. An image already
    built from the same sources, base and extras is kept as it is. With --runtime, the engine
    is checked to run that runtime as the sandbox needs (runsc: gVisor)."""
    with exits.reported():
        client = engine()
        check_runtime(client, runtime or None)
        progress = Progress()
        try:
            built = image_build.build(
                client, DEFAULT_IMAGE, base, extra, no_cache, say=progress.say, step=progress.step
            )
        finally:
            progress.close()
        if runtime:  # the image starts under it: what a sandbox start would find out later
            image_build.smoke(client, built.name, runtime)
        seconds = time.monotonic() - progress.started
        if built.fresh:
            click.echo(f"built {built.name} ({built.hash}) in {seconds:.0f} s")
        else:
            click.echo(f"image {built.name} is up to date ({built.hash})")
