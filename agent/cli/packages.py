"""`sandcell packages`: the operator's wheelhouse, the packages a sandbox may `%pip install`
offline. `add` resolves (held to the image's pins) and indexes, `list` shows, `remove` drops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sandcell.agent.cli import exits, terminal

if TYPE_CHECKING:
    from sandcell.sandbox.wheelhouse import Wheelhouse


def _house(value: str | None) -> Wheelhouse:
    from sandcell.sandbox.wheelhouse import Wheelhouse, default_dir

    return Wheelhouse(Path(value).expanduser() if value else default_dir())


folder_option = click.option(
    "--wheelhouse",
    metavar="DIR",
    help="The wheelhouse folder [default: $SANDCELL_WHEELHOUSE, else "
    "~/.cache/sandcell/wheelhouse, or under $SANDCELL_CACHE].",
)


@click.group("packages")
def packages_cmd() -> None:
    """The wheelhouse: packages a sandbox may install with `%pip install NAME`, offline. It is
    mounted read-only into every sandbox made for the same Python (see `sandcell doctor`)."""


@packages_cmd.command("add")
@click.argument("wanted", nargs=-1, metavar="NAME[==VERSION]... | ./FILE.whl...")
@click.option(
    "-r",
    "--requirement",
    "requirement_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A requirements file (repeatable).",
)
@click.option("--python", metavar="X.Y", help="The Python to add for [default: the "
              "wheelhouse's, else the sandbox image's].")  # fmt: skip
@folder_option
@exits.reported()
def add_cmd(
    wanted: tuple[str, ...],
    requirement_files: tuple[Path, ...],
    python: str | None,
    wheelhouse: str | None,
) -> None:
    """Download wheels for NAME (and what it needs, held to the image's pinned versions), or
    take local .whl files, into the wheelhouse. Nothing is added unless all of it resolves.
    Exit 0 added, 1 refused (the wheelhouse unchanged), 2 usage, 3 no engine to ask the
    image's Python (give --python)."""
    from sandcell.sandbox.wheelhouse import WheelhouseError, add

    if not wanted and not requirement_files:
        raise click.UsageError("say what to add: NAME[==VERSION], ./FILE.whl or -r FILE")
    wheels = [Path(w) for w in wanted if w.endswith(".whl")]
    missing = [str(w) for w in wheels if not w.is_file()]
    if missing:
        raise click.UsageError(f"no such wheel file: {', '.join(missing)}")
    house = _house(wheelhouse)
    try:
        python = python or _python_for(house)
        said = add(
            house,
            [w for w in wanted if not w.endswith(".whl")],
            list(requirement_files),
            wheels,
            python,
            say=lambda line: terminal.echo(f"sandcell: {line}", err=True),
        )
    except WheelhouseError as error:
        exits.fail(str(error), exits.STOPPED)
    terminal.echo(f"added {len(said.wheels)} wheel(s) to {house.path} (Python {python})")
    for name in said.wheels:
        terminal.echo(f"  + {name}")
    if said.already:
        terminal.echo(f"already there: {', '.join(said.already)}")
    if said.in_image:
        terminal.echo(f"not kept, the image has them: {', '.join(said.in_image)}")


def _python_for(house: Wheelhouse) -> str:
    """The wheelhouse's Python, else the image's (asked of the engine)."""
    if house.exists():
        return house.python
    from sandcell.sandbox import image_build
    from sandcell.sandbox.container import DEFAULT_IMAGE, engine

    client = engine()
    if not image_build.inspect(client, DEFAULT_IMAGE).present:
        raise click.UsageError(
            f"the image {DEFAULT_IMAGE} is not built, so its Python is unknown: build it "
            "(`sandcell image build`) or give --python X.Y"
        )
    return image_build.image_platform(client, DEFAULT_IMAGE)[0]


@packages_cmd.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the packages as JSON.")
@folder_option
@exits.reported()
def list_cmd(as_json: bool, wheelhouse: str | None) -> None:
    """The wheelhouse's packages and versions, its Python and size."""
    from sandcell.sandbox.wheelhouse import WheelhouseError

    house = _house(wheelhouse)
    if not house.exists():
        exits.fail(f"no wheelhouse at {house.path}; make one with `sandcell packages add NAME`", 1)
    try:
        made_for = house.made_for()
    except WheelhouseError as error:
        exits.fail(str(error), exits.STOPPED)
    packages = house.packages()
    if as_json:
        click.echo(json.dumps({"wheelhouse": str(house.path), "python": made_for[0],
                               "machine": made_for[1], "packages": packages}, indent=1))  # fmt: skip
        return
    terminal.echo(
        f"{house.path}: {len(packages)} package(s), {house.size() / 1e6:.1f} MB, for Python "
        f"{made_for[0]} on {made_for[1]}"
    )
    for name, versions in packages.items():
        terminal.echo(f"  {name} {', '.join(versions)}")


@packages_cmd.command("remove")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
@folder_option
@exits.reported()
def remove_cmd(names: tuple[str, ...], wheelhouse: str | None) -> None:
    """Remove every version of each NAME from the wheelhouse (sandboxes already running keep
    what they installed). Exit 0, or 1 when a NAME is not there."""
    from sandcell.sandbox.wheelhouse import WheelhouseError, remove

    house = _house(wheelhouse)
    if not house.exists():
        exits.fail(f"no wheelhouse at {house.path}", exits.STOPPED)
    for name in names:
        try:
            gone = remove(house, name)
        except WheelhouseError as error:
            exits.fail(str(error), exits.STOPPED)
        terminal.echo(f"removed {name}: {', '.join(gone)}")
