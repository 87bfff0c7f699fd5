"""What every command shares: exit statuses and the --input option. Nothing heavy is
imported here, so `exec`, `gc` and `tool` start without loading the model client."""

from pathlib import Path

import click

EXIT_STOPPED, EXIT_UNAVAILABLE, EXIT_MODEL = 1, 3, 4


def input_option(help_text: str):
    """The repeatable --input PATH option: an existing file, mounted read-only."""
    return click.option(
        "--input",
        "inputs",
        multiple=True,
        help=help_text,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
    )
