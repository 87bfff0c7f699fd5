"""`sandcell chat`: a terminal conversation over the user's files.

Questions share one sandbox (kernel state, files) and one history. Ctrl-C while the agent
works interrupts the running cell; a second Ctrl-C (or one at the prompt) ends the session
cleanly, leaving trace.jsonl, notebook.ipynb and the workspace in the session folder. Under
gVisor, /quit and Ctrl-D pause the kernel into the folder first: `sandcell chat --resume
DIR` restores it and the conversation (elsewhere it re-runs the session's cells)."""

import shlex
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape as escape_markup

from sandcell.agent import stops
from sandcell.agent.cli import exits
from sandcell.agent.cli.console import EventPrinter
from sandcell.agent.cli.options import (
    agent_options,
    build_agent,
    check_output_folder,
    input_option,
    output_folder,
    output_option,
    overwrite_option,
)
from sandcell.agent.cli.terminal import for_terminal
from sandcell.agent.events import Event, Question, Rebuilt, SandboxResumed, SessionStarted
from sandcell.agent.records import history
from sandcell.agent.records.replay import recorded_cells, rerun
from sandcell.agent.records.trace import all_inputs, read_events
from sandcell.agent.seams import ModelError, RunResult, Terminated
from sandcell.agent.session import FIGURES_DIR, PAUSED_DIR, Agent, Session
from sandcell.sandbox import DockerSandbox, SandboxError
from sandcell.sandbox.errors import SandboxUnavailable
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.pool import warmed


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
@click.option(
    "--resume",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Continue the session in this folder: its kernel as /quit paused it (gVisor), else "
    "rebuilt by re-running its cells; its conversation and input files as they were.",
)
@agent_options
@exits.reported()
def chat_cmd(
    inputs: tuple[Path, ...],
    output: Path | None,
    overwrite: bool,
    resume: Path | None,
    opts: dict[str, Any],
) -> None:
    """Talk with the agent about your files."""
    console = Console(highlight=False)
    if resume is not None:
        if inputs or output or overwrite:
            raise click.UsageError(
                "--resume continues a session with its own folder and input files: leave out "
                "--input, --output and --overwrite"
            )
        folder, events = resume, recorded(resume)
        if not opts["runtime"]:  # the runtime it ran under: a paused kernel needs it again
            started = next((e for e in events if isinstance(e, SessionStarted)), None)
            opts = {**opts, "runtime": started and started.limits.get("runtime")}
        session = continued(build_agent(opts, EventPrinter(console)), folder, events, console)
    else:
        folder = output or Path("sandcell-out") / time.strftime("chat-%Y%m%d-%H%M%S")
        checked = Inputs.from_paths(inputs)  # a bad input is refused before anything is made
        check_output_folder(folder, overwrite)
        agent = build_agent(opts, EventPrinter(console))  # checked before --overwrite clears
        output_folder(folder, overwrite)
        exits.keep_details_in(folder)
        session = agent.session(checked, folder)
    names = ", ".join(item.sandbox_path for item in session.inputs) or "no input files"
    console.print(f"sandcell chat: {names}. /help for commands, Ctrl-D to leave.")
    try:
        if converse(session, folder, console):
            save_history(session, folder, console)  # a /reset since the last question too
            pause(session, console)
    finally:
        session.close()
        console.print(
            f"session saved in {escape(console, folder)}: trace.jsonl, notebook.ipynb, and "
            "what the code made (output/, figures/, workspace/); continue it with  sandcell "
            f"chat --resume {escape(console, shlex.quote(str(folder)))}"
        )


def converse(session: Session, folder: Path, console: Console) -> bool:
    """Questions and /commands until the user leaves: True by /quit or Ctrl-D (the kernel
    is then paused where it can be), False by Ctrl-C."""
    shown: set[str] = set()
    while True:
        try:
            question = input("you> ").strip()
        except EOFError:
            console.print()
            return True
        except KeyboardInterrupt as stop:
            console.print()
            if isinstance(stop, Terminated):
                raise
            return False
        if not question:
            continue
        if question.startswith("/"):
            if not slash(question, session, console):
                return True
            continue
        try:
            result = ask_interruptibly(session, question, console)
        except KeyboardInterrupt as stop:
            console.print("\n[yellow]ending the session...[/yellow]")
            if isinstance(stop, Terminated):
                raise
            return False
        finally:
            save_history(session, folder, console)
        if result is not None:
            show_new_charts(result, folder, shown, console)


def save_history(session: Session, folder: Path, console: Console) -> None:
    """The conversation, for --resume; a failure is said, not fatal."""
    try:
        history.save(folder, session.messages)
    except OSError as error:
        console.print(f"[yellow]history not saved: {escape(console, error)}[/yellow]")


def pause(session: Session, console: Console) -> None:
    """Keep the kernel for --resume, where it can be (gVisor); else say why not."""
    if not session.sandbox_used:
        return  # no code ran: a fresh kernel is where it left off
    try:
        paused = session.pause("quit")
    # PauseError (runc, an engine without checkpoints), or the engine's, the disk's: said
    except Exception as error:
        console.print(
            f"[yellow]its kernel was not paused ({escape(console, error)}); --resume re-runs "
            "its cells[/yellow]"
        )
        return
    console.print(f"kernel paused in {paused.seconds:.1f} s ({paused.size / (1 << 20):.0f} MB)")


def recorded(folder: Path) -> list[Event]:
    """The events of the session in `folder`: UsageError when it holds none."""
    try:
        events = read_events(folder / "trace.jsonl")
    except (OSError, ValueError) as error:
        raise click.UsageError(f"--resume {folder}: no session trace there ({error})") from None
    if not events:
        raise click.UsageError(f"--resume {folder}: its trace is empty")
    return events


def continued(agent: Agent, folder: Path, events: list[Event], console: Console) -> Session:
    """The session in `folder` again: its inputs, its conversation, and its kernel (restored
    from its pause, else rebuilt by re-running its cells)."""
    named = {item["name"]: Path(item["path"]) for item in all_inputs(events)}
    inputs = Inputs.from_paths(named)  # one gone or unreadable: said (InputError)
    exits.keep_details_in(folder)
    cells = recorded_cells(events)
    began, kept = time.monotonic(), (folder / PAUSED_DIR).is_dir()
    sandbox, why = restored(agent, folder, inputs)
    resumed = SandboxResumed(seconds=round(time.monotonic() - began, 2), error=why)
    happened: list[Event] = [resumed] if kept else []
    if sandbox is not None:
        console.print(f"its kernel is back as it was (restored in {resumed.seconds:.1f} s)")
    elif cells:
        console.print(
            f"[yellow]its kernel is rebuilt by re-running its {len(cells)} recorded cell(s) "
            f"({escape(console, why or 'no paused kernel was kept')})...[/yellow]"
        )
        sandbox = warmed(DockerSandbox(agent.limits, inputs, agent.image))
        try:
            skipped = rerun(sandbox, cells, rebuild=True)
        except BaseException:  # Ctrl-C too: the sandbox must not outlive the command
            sandbox.close()
            raise
        happened.append(Rebuilt(cells=len(cells), skipped=len(skipped), reason="resume"))
    session = agent.session(inputs, folder, sandbox=sandbox)
    for event in happened:
        session.publish(event)
    session.loop.restore(history.load(folder), sum(isinstance(e, Question) for e in events))
    return session


def restored(agent: Agent, folder: Path, inputs: Inputs) -> tuple[DockerSandbox | None, str | None]:
    """The sandbox /quit paused into the folder, restored; or None and why not (None: no
    pause was kept). The pause is used once: the kernel moves on from it, or from the one
    rebuilt instead. An engine, image or runtime missing (nothing tried) keeps it: exit 3."""
    paused = folder / PAUSED_DIR
    if not paused.is_dir():
        return None, None
    try:
        sandbox = DockerSandbox(agent.limits, inputs, agent.image, resume_from=paused)
    except SandboxUnavailable:
        raise
    except SandboxError as error:  # PauseError: another image, runc, a tampered checkpoint
        shutil.rmtree(paused, ignore_errors=True)
        return None, str(error)
    shutil.rmtree(paused, ignore_errors=True)
    return sandbox, None
