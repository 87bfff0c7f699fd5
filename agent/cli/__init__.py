"""The `sandcell` command. Each subcommand lives in its own module, imported only when it
runs (or for --help): `exec`, `gc` and `tool` then start without the model client."""

import importlib
from importlib.metadata import version

import click

COMMANDS = {  # name -> "module:attribute"
    "exec": "agent.cli.exec:exec_cmd",
    "gc": "agent.cli.gc:gc_cmd",
    "tool": "agent.cli.tool:tool",
    "replay": "agent.cli.replay:replay_cmd",
    "run": "agent.cli.run:run_cmd",
    "batch": "agent.cli.batch:batch_cmd",
    "report": "agent.cli.report:report_cmd",
    "chat": "agent.cli.chat:chat_cmd",
    "serve": "agent.cli.serve:serve_cmd",
    "mcp": "agent.cli.mcp:mcp_cmd",
}


class LazyGroup(click.Group):
    """click's documented pattern for subcommands loaded on use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version("sandcell"), prog_name="sandcell")
@click.option(
    "--debug",
    is_flag=True,
    envvar="SANDCELL_DEBUG",
    help="Show the traceback of an internal error instead of saving it to a file.",
)
def main(debug: bool) -> None:
    """sandcell: a code-interpreter agent whose Python runs in a sealed Docker sandbox."""
    from agent.cli import exits

    exits.Debug.enabled, exits.Debug.details_dir = debug, None
    exits.setup_logging(debug)
    exits.handle_signals()
