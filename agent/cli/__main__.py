"""`python -m agent.cli`: the same as the `sandcell` command."""

from agent.cli import main

main(prog_name="sandcell")
