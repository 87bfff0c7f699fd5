"""`sandcell chat`: a terminal conversation over the user's files.

Questions share one sandbox (kernel state, files) and one history. Ctrl-C while the agent
works interrupts the running cell; a second Ctrl-C (or one at the prompt) ends the session
cleanly, leaving trace.jsonl, notebook.ipynb and the workspace in the session folder."""

import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape as escape_markup

from agent import stops
from agent.cli import exits
from agent.cli.console import EventPrinter
from agent.cli.options import (
    agent_options,
    build_agent,
    check_output_folder,
    input_option,
    output_folder,
    output_option,
    overwrite_option,
)
from agent.cli.terminal import for_terminal
from agent.seams import ModelError, RunResult, Terminated
from agent.session import FIGURES_DIR, Session
from sandbox import SandboxError
from sandbox.inputs import Inputs


def escape(console: Console, text: object) -> str:
    """Text from elsewhere (an error, a file name the code chose) as markup for this console:
    control characters visible on a terminal (agent.cli.terminal), brackets not markup."""
    return escape_markup(for_terminal(str(text), console.is_terminal))


HELP = """commands:
  /files        list the files in /workspace
  /export DIR   copy /workspace to DIR on this machine
  /reset        fresh kernel and empty history (workspace files are kept)
  /help         this text
  /quit         end the session (Ctrl-D too)
Ctrl-C interrupts a running cell; Ctrl-C again ends the session."""


def ask_interruptibly(session: Session, question: str, console: Console) -> RunResult | None:
    """Run one question in a worker thread, so Ctrl-C reaches this one: the first interrupts
    the running cell, a second ends the session (KeyboardInterrupt), as SIGTERM does at once
    (Terminated). Returns the result, or None when the question failed."""
    done = threading.Event()
    outcome: list = []

    def work() -> None:
        try:
            outcome.append(session.ask(question))
        except BaseException as error:  # handed to the main thread below, never dropped
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=work, daemon=True, name="question").start()
    interrupted = False
    while not done.is_set():
        try:
            done.wait(0.1)
        except KeyboardInterrupt as stop:
            if interrupted or isinstance(stop, Terminated):
                reason = stops.TERMINATED if isinstance(stop, Terminated) else stops.INTERRUPTED
                session.stop(reason, within=30)  # the trace stays whole: the question ends first
                raise
            interrupted = True
            session.interrupt()
            console.print(
                "\n[yellow]interrupted the running cell (Ctrl-C again ends the session)[/yellow]"
            )
    if outcome and isinstance(outcome[0], (ModelError, SandboxError)):
        console.print(f"[red]sandcell: {escape(console, outcome[0])}[/red]")
        return None
    if outcome and isinstance(outcome[0], BaseException):
        raise outcome[0]  # a bug: exits.reported() says so in one line (exit 70)
    return outcome[0] if outcome else None


def show_new_charts(result: RunResult, folder: Path, shown: set[str], console: Console) -> None:
    """The charts the question's code drew, by their path on this machine, once each."""
    for path in result.files:
        if Path(path).parent == folder / FIGURES_DIR and path not in shown:
            shown.add(path)
            console.print(f"[bold]chart:[/bold] {escape(console, path)}")


def slash(command: str, session: Session, console: Console) -> bool:
    """Handle a /command; False when the session should end. A command that fails says why
    and the session goes on."""
    try:
        return _slash(command, session, console)
    except (SandboxError, OSError) as error:
        console.print(
            f"[red]{escape(console, command.split()[0])} failed: {escape(console, error)}[/red]"
        )
        return True


def _slash(command: str, session: Session, console: Console) -> bool:
    name, _, arg = command.partition(" ")
    if name in ("/quit", "/exit"):
        return False
    if name == "/files":
        files = session.files()
        for f in files:
            console.print(f"  {escape(console, f['path'])}  ({f['size']} bytes)")
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
        console.print(f"unknown command {escape(console, name)}; /help lists them")
    return True


@click.command("chat")
@input_option("A file to talk about, read-only at /data/<name> (repeatable).")
@output_option("Session folder [default: sandcell-out/chat-<time>].")
@overwrite_option
@agent_options
@exits.reported()
def chat_cmd(inputs, output, overwrite, opts):
    """Talk with the agent about your files."""
    console = Console(highlight=False)
    folder = output or Path("sandcell-out") / time.strftime("chat-%Y%m%d-%H%M%S")
    checked = Inputs.from_paths(inputs)  # a bad input is refused before anything is made
    check_output_folder(folder, overwrite)
    agent = build_agent(opts, EventPrinter(console))  # checked before --overwrite clears
    output_folder(folder, overwrite)
    exits.keep_details_in(folder)
    session = agent.session(checked, folder)
    names = ", ".join(item.sandbox_path for item in session.inputs) or "no input files"
    console.print(f"sandcell chat: {names}. /help for commands, Ctrl-D to leave.")
    shown: set[str] = set()
    try:
        while True:
            try:
                question = input("you> ").strip()
            except EOFError:
                console.print()
                break
            except KeyboardInterrupt as stop:
                console.print()
                if isinstance(stop, Terminated):
                    raise
                break
            if not question:
                continue
            if question.startswith("/"):
                if not slash(question, session, console):
                    break
                continue
            try:
                result = ask_interruptibly(session, question, console)
            except KeyboardInterrupt as stop:
                console.print("\n[yellow]ending the session...[/yellow]")
                if isinstance(stop, Terminated):
                    raise
                break
            if result is not None:
                show_new_charts(result, folder, shown, console)
    finally:
        session.close()
        console.print(
            f"session saved in {folder}: trace.jsonl, notebook.ipynb, and what the code made "
            "(output/, figures/, workspace/)"
        )
