"""The `sandcell` command. Each subcommand lives in its own module, imported only when it
runs (or for --help): `exec`, `gc` and `tool` then start without the model client."""

import importlib

import click

COMMANDS = {  # name -> "module:attribute"
    "exec": "sandcell.agent.cli.exec:exec_cmd",
    "gc": "sandcell.agent.cli.gc:gc_cmd",
    "tool": "sandcell.agent.cli.tool:tool",
    "replay": "sandcell.agent.cli.replay:replay_cmd",
    "run": "sandcell.agent.cli.run:run_cmd",
    "batch": "sandcell.agent.cli.batch:batch_cmd",
    "report": "sandcell.agent.cli.report:report_cmd",
    "chat": "sandcell.agent.cli.chat:chat_cmd",
    "serve": "sandcell.agent.cli.serve:serve_cmd",
    "mcp": "sandcell.agent.cli.mcp:mcp_cmd",
    "image": "sandcell.agent.cli.image:image_cmd",
    "doctor": "sandcell.agent.cli.doctor:doctor_cmd",
    "recipe": "sandcell.agent.cli.recipe:recipe_cmd",
    "packages": "sandcell.agent.cli.packages:packages_cmd",
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


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from sandcell.sandbox.image_build import sandcell_version, sources_hash

    click.echo(f"sandcell {sandcell_version()} (sandbox image sources {sources_hash()})")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and the hash of the image sources it expects, then exit.",
)
@click.option(
    "--debug",
    is_flag=True,
    envvar="SANDCELL_DEBUG",
    help="Show the traceback of an internal error instead of saving it to a file.",
)
def main(debug: bool) -> None:
    """sandcell: a code-interpreter agent whose Python runs in a sealed Docker sandbox."""
    from sandcell.agent.cli import exits

    exits.Debug.enabled, exits.Debug.details_dir = debug, None
    context = click.get_current_context()
    context.call_on_close(exits.setup_logging(debug))
    context.call_on_close(exits.close_telemetry)  # first (last in): while logging is sandcell's
    exits.handle_signals()
