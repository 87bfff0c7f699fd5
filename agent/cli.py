"""The `sandcell` command. Each subcommand lives in its own module; this file only
assembles them, so one reason to change per module holds."""

from importlib.metadata import version

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version("sandcell"), prog_name="sandcell")
def main() -> None:
    """sandcell: a code-interpreter agent whose Python runs in a sealed Docker sandbox."""


from agent.cmd_exec import exec_cmd, gc_cmd  # noqa: E402  (commands register below the group)

main.add_command(exec_cmd)
main.add_command(gc_cmd)
from agent.cmd_tool import tool  # noqa: E402

main.add_command(tool)
from agent.cmd_replay import replay_cmd  # noqa: E402

main.add_command(replay_cmd)

from agent.cmd_batch import batch_cmd  # noqa: E402
from agent.cmd_chat import chat_cmd  # noqa: E402
from agent.cmd_run import run_cmd  # noqa: E402

main.add_command(run_cmd)
main.add_command(batch_cmd)
main.add_command(chat_cmd)

if __name__ == "__main__":
    main()
