"""`sandcell recipe RUN_DIR -o recipe.py`: the cells of a run whose outputs passed their
checks, as a script other files of the family can run (`batch --recipe`); `sandcell recipe
--check recipe.py` says whether a recipe parses and which parameters it expects; `sandcell
recipe --list DIR` lists a library of recipes (`batch --recipe auto` keeps one in OUT/recipes)."""

from __future__ import annotations

from pathlib import Path

import click

from sandcell.agent.cli import exits, terminal


@click.command("recipe")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the recipe [default: stdout].",
)
@click.option("--check", is_flag=True, help="SOURCE is a recipe: check it instead.")
@click.option(
    "--list",
    "listing",
    is_flag=True,
    help="SOURCE is a library folder: list its recipes (layout, origin, jobs solved).",
)
@exits.reported()
def recipe_cmd(source: Path, output: Path | None, check: bool, listing: bool) -> None:
    """Make a recipe from the run or batch-job folder SOURCE (its outputs must have passed
    their checks); with --check, say whether the recipe SOURCE parses and what it expects;
    with --list, list the library folder SOURCE. Exit 0, or 2 with what is wrong."""
    from sandcell.agent.jobs.recipe_maker import RecipeError, from_run, load

    if check and listing:
        raise click.UsageError("give --check (a recipe) or --list (a library folder), not both")
    try:
        if listing:
            list_library(source)
            return
        if check:
            loaded = load(source)
            terminal.echo(
                f"{source}: parses; {len(loaded.cells)} cells; parameters: INPUTS, a list of "
                f"{loaded.inputs} input path(s) (a job's inputs, in its order)"
            )
            return
        if source.is_file():
            raise RecipeError(f"{source} is a file: give a run folder (or --check a recipe)")
        recipe = from_run(source)
    except RecipeError as error:
        raise click.UsageError(str(error)) from None
    script = recipe.script()
    if output is None:
        click.echo(script, nl=False)
        return
    output.write_text(script, encoding="utf-8")
    terminal.echo(
        f"wrote {output}: {len(recipe.cells)} cells ({recipe.left_out} failed or stopped "
        f"left out), {len(recipe.inputs)} input parameter(s)",
        err=True,
    )


def list_library(folder: Path) -> None:
    """Each recipe of the library: its file, layout, origin and the jobs it solved (from the
    batch's results lines beside the folder, when there are any)."""
    from sandcell.agent.jobs.recipe_library import Library, solved_counts
    from sandcell.agent.jobs.recipe_maker import RecipeError

    if not folder.is_dir():
        raise RecipeError(f"{folder} is not a folder: --list takes a library (OUT/recipes)")
    library = Library.load(folder)
    solved = solved_counts(folder)
    if not library.entries:
        terminal.echo(f"{folder}: no recipes")
        return
    for entry in library.entries:
        layout = entry.recipe.layout
        assert layout is not None  # Library.load refuses a recipe without one
        count = None if solved is None else solved.get(entry.name, 0)
        jobs = "" if count is None else f"; solved {count} job" + ("" if count == 1 else "s")
        terminal.echo(f"{entry.name}: layout {layout.key} ({layout.describe()}){jobs}")
        terminal.echo(f"  made from {entry.recipe.made_from or 'an unknown run'}")
