"""A served session's folder read back after a server restart: whose session it is, what the
listing shows of it, and what continuing it needs (its inputs, its conversation, the cells
that rebuild its kernel). The conversation is saved beside the trace after each question."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.agent.events import Question, SandboxPaused, SandboxReleased, SandboxResumed
from sandcell.agent.records import history
from sandcell.agent.records.replay import Cell, recorded_cells
from sandcell.agent.records.trace import all_inputs, read_events
from sandcell.agent.serve import files, titles
from sandcell.agent.serve.listing import SessionInfo
from sandcell.agent.session import PAUSED_DIR
from sandcell.sandbox import Inputs

log = logging.getLogger(__name__)
SESSION_ID = re.compile(r"[0-9a-f]{16}")  # what Sessions.create names a session's folder


@dataclass
class Stored:
    """A session on disk from before the server started; its info() is what a listing shows
    until the session is used again."""

    id: str
    user: str
    folder: Path
    created: str
    questions: int
    inputs: list[str] = field(default_factory=list)
    first_question: str = ""

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            title=titles.read(self.folder) or titles.clean(self.first_question),
            created=self.created,
            running=False,
            sandbox="paused" if (self.folder / PAUSED_DIR).is_dir() else "released",
            inputs=self.inputs,
            questions=self.questions,
            resumed=True,
        )


@dataclass
class Past:
    created: str
    inputs: Inputs
    questions: int
    messages: list[dict]
    cells: list[Cell]
    first_question: str = ""
    not_paused: str | None = None  # why its kernel was not paused when it last went


def stored_sessions(data: Path) -> Iterator[Stored]:
    """Every session under DATA/<user>/<id>/ that has a trace; one that cannot be read is
    left where it is, with a warning, not listed."""
    for trace in sorted(data.glob("*/*/trace.jsonl")):
        folder = trace.parent
        if not SESSION_ID.fullmatch(folder.name) or folder.parent.name.startswith("."):
            continue
        try:
            events = read_events(trace)
            names = list(dict.fromkeys(item["name"] for item in all_inputs(events)))
        except (OSError, ValueError, KeyError, TypeError) as error:  # UnicodeDecodeError too
            log.warning(
                "session folder %s not resumed: its trace cannot be read (%s)", folder, error
            )
            continue
        if not events:
            continue
        questions = sum(1 for e in events if isinstance(e, Question))
        created = events[0].time or ""
        yield Stored(
            folder.name, folder.parent.name, folder, created, questions, names, first(events)
        )


def first(events: list) -> str:
    """The session's first question, as its title until it is given one."""
    return next((str(e.task or "") for e in events if isinstance(e, Question)), "")


def read_past(stored: Stored) -> Past:
    """What continuing a stored session needs (nothing wrote its folder since it was
    listed: no server object held it). Raises InputError when its uploads are no longer
    usable (the message says which)."""
    events = read_events(stored.folder / "trace.jsonl")
    uploads = stored.folder / files.INPUTS_DIR
    # the recorded order, and only the uploads still there (the folder is the truth)
    paths = {name: uploads / name for name in stored.inputs if (uploads / name).is_file()}
    return Past(
        created=stored.created,
        inputs=Inputs.from_paths(paths),
        questions=stored.questions,
        messages=history.load(stored.folder),
        cells=recorded_cells(events),
        first_question=stored.first_question,
        not_paused=_not_paused(events, stored.folder),
    )


def _not_paused(events: list, folder: Path) -> str | None:
    """Why the session's last kernel is not waiting, paused, in its folder: what its last
    release said, that its checkpoint is gone, or that the server stopped without pausing it;
    None when it is there, or when no cell ran."""
    if (folder / PAUSED_DIR).is_dir() or not recorded_cells(events):
        return None
    kinds = (SandboxPaused, SandboxReleased, SandboxResumed)
    last = next((e for e in reversed(events) if isinstance(e, kinds)), None)
    if isinstance(last, SandboxPaused):
        return "its checkpoint is no longer in the session folder"
    if isinstance(last, SandboxReleased):
        return last.not_paused
    return "the server stopped without pausing it (killed, or a question still ran at --stop-grace)"
