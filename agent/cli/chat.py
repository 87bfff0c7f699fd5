"""`sandcell chat`: a terminal conversation over the user's files.

Questions share one sandbox (kernel state, files) and one history. Ctrl-C while the agent
works interrupts the running cell; a second Ctrl-C (or one at the prompt) ends the session
cleanly, leaving trace.jsonl, notebook.ipynb and the workspace in the session folder."""

import signal
import threading
import time
from pathlib import Path

import click
from rich.console import Console

from agent.cli import exits
from agent.cli.console import EventPrinter
from agent.cli.options import agent_options, build_agent, input_option
from agent.seams import ModelError
from agent.session import FIGURES_DIR, Session
from sandbox import SandboxError

HELP = """commands:
  /files        list the files in /workspace
  /export DIR   copy /workspace to DIR on this machine
  /reset        fresh kernel and empty history (workspace files are kept)
  /help         this text
  /quit         end the session (Ctrl-D too)
Ctrl-C interrupts a running cell; Ctrl-C again ends the session."""


def ask_interruptibly(session: Session, question: str, console: Console) -> bool:
    """Run one question in a worker thread; returns False when the user asked to quit."""
    done = threading.Event()
    outcome: list = []

    def work() -> None:
        try:
            outcome.append(session.ask(question))
        except (ModelError, SandboxError) as error:
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=work, daemon=True, name="question").start()
    interrupted = False
    while not done.is_set():
        try:
            done.wait(0.1)
        except KeyboardInterrupt:
            if interrupted:
                console.print("\n[yellow]ending the session...[/yellow]")
                return False
            interrupted = True
            session.interrupt()
            console.print(
                "\n[yellow]interrupted the running cell (Ctrl-C again ends the session)[/yellow]"
            )
    if outcome and isinstance(outcome[0], Exception):
        console.print(f"[red]sandcell: {outcome[0]}[/red]")
    return True


def show_new_charts(session: Session, host_dir: Path, console: Console) -> None:
    """Copy the charts the code drew to the session folder and print where they are."""
    if not session.sandbox_used:
        return  # no code ran: no charts
    before = set(host_dir.glob("*.png")) if host_dir.exists() else set()
    try:
        copied = session.export(host_dir, FIGURES_DIR)
    except SandboxError as error:
        console.print(f"[red]could not copy the charts: {error}[/red]")
        return
    for path in sorted(set(map(Path, copied)) - before):
        console.print(f"[bold]chart:[/bold] {path}")


def slash(command: str, session: Session, console: Console) -> bool:
    """Handle a /command; False when the session should end."""
    name, _, arg = command.partition(" ")
    if name in ("/quit", "/exit"):
        return False
    if name == "/files":
        files = session.files()
        for f in files:
            console.print(f"  {f['path']}  ({f['size']} bytes)")
        if not files:
            console.print("  (the workspace is empty)")
    elif name == "/export":
        if not arg.strip():
            console.print("usage: /export DIR")
        else:
            copied = session.export(Path(arg.strip()).expanduser(), "")
            console.print(f"copied {len(copied)} files to {arg.strip()}")
    elif name == "/reset":
        session.reset()
        console.print("fresh kernel, empty history; workspace files kept")
    elif name == "/help":
        console.print(HELP)
    else:
        console.print(f"unknown command {name}; /help lists them")
    return True


@click.command("chat")
@input_option("A file to talk about, read-only at /data/<name> (repeatable).")
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Session folder [default: sandcell-out/chat-<time>].",
)
@agent_options
@exits.reported()
def chat_cmd(inputs, output, opts):
    """Talk with the agent about your files."""
    # Ctrl-C is how the user stops a cell, so it must raise KeyboardInterrupt even when the
    # parent started us with SIGINT ignored (any `cmd &` from a script does, and it inherits).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    console = Console(highlight=False)
    folder = output or Path("sandcell-out") / time.strftime("chat-%Y%m%d-%H%M%S")
    session = build_agent(opts, EventPrinter(console)).session(list(inputs), folder)
    names = ", ".join(item.sandbox_path for item in session.inputs) or "no input files"
    console.print(f"sandcell chat: {names}. /help for commands, Ctrl-D to leave.")
    try:
        while True:
            try:
                question = input("you> ").strip()
            except (EOFError, KeyboardInterrupt):
                console.print()
                break
            if not question:
                continue
            if question.startswith("/"):
                if not slash(question, session, console):
                    break
                continue
            if not ask_interruptibly(session, question, console):
                break
            show_new_charts(session, folder / "figures", console)
    finally:
        try:
            copied = len(session.export(folder / "workspace", "")) if session.sandbox_used else 0
        except SandboxError as error:  # the answer and trace matter more than the files
            console.print(f"[red]could not copy the workspace: {error}[/red]")
            copied = 0
        session.close()
        console.print(
            f"session saved in {folder}: trace.jsonl, notebook.ipynb, workspace/ ({copied} files)"
        )
