"""`sandcell recipe RUN_DIR -o recipe.py`: the cells of a run whose outputs passed their
checks, as a script other files of the family can run (`batch --recipe`); `sandcell recipe
--check recipe.py` says whether a recipe parses and which parameters it expects."""

from __future__ import annotations

from pathlib import Path

import click

from agent.cli import exits, terminal


@click.command("recipe")
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the recipe [default: stdout].",
)
@click.option("--check", is_flag=True, help="SOURCE is a recipe: check it instead.")
@exits.reported()
def recipe_cmd(source: Path, output: Path | None, check: bool) -> None:
    """Make a recipe from the run or batch-job folder SOURCE (its outputs must have passed
    their checks), or with --check, say whether the recipe SOURCE parses and what it expects.
    Exit 0, or 2 with what is wrong."""
    from agent.jobs.recipe_maker import RecipeError, from_run, load

    try:
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
