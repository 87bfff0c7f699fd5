"""`python -m sandcell.agent.cli`: the same as the `sandcell` command."""

from sandcell.agent.cli import main

main(prog_name="sandcell")
