"""trace.jsonl: one JSON object a line, appended and flushed as each step happens, so a crash
loses no finished step. The writer is one subscriber of a session's events (agent.events:
session, sandbox, question, step, protocol, reset, inputs, sandbox_released, sandbox_paused,
sandbox_resumed, rebuilt, export_failed, final); `read_events` parses a trace back into them."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from pathlib import Path
from typing import IO, Self

from sandcell.agent.events import Event, InputsAdded, SessionStarted


class TraceWriter:
    """Each event is flushed to the OS before write() returns (a crash of this process loses
    nothing); the disk sync follows a moment later on the syncing thread, many writes to one
    sync, so a cell's latency does not carry a 3-4 ms fsync (a machine crash may lose the
    last few milliseconds). close() syncs before it returns."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()  # written from several threads: a question, routes, a reaper
        self._syncing = threading.Lock()  # a sync under way and close() never overlap

    def __call__(self, event: Event) -> None:
        """The trace as a subscriber: what it keeps is written; a live front end's events
        (tokens, a running cell's output, a step's parts as they happen) are not."""
        if event.traced:
            self.write(event)

    def write(self, event: Event) -> None:
        record = event.to_json()
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        record = {"type": record.pop("type"), "time": record.pop("time", None) or now, **record}
        line = json.dumps(record, ensure_ascii=False, default=_plain) + "\n"
        with self._lock:
            if self._file is None:
                raise ValueError(f"the trace {self.path} is closed")
            self._file.write(line)
            self._file.flush()
        _SYNCER.mark(self)

    def sync(self) -> None:
        with self._syncing:
            if self._file is not None:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._syncing, self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_torn_tail(path: Path) -> None:
    """A last line that a crash cut short would swallow the next event appended: cut it."""
    try:
        f = path.open("rb+")
    except FileNotFoundError:
        return
    with f:
        end = pos = f.seek(0, os.SEEK_END)
        while pos > 0:
            step = min(pos, 1 << 16)
            f.seek(pos - step)
            newline = f.read(step).rfind(b"\n")
            if newline >= 0:
                pos += newline + 1 - step
                break
            pos -= step
        if pos != end:
            f.truncate(pos)


class _Syncer:
    """One thread that syncs the traces written since its last round (group commit)."""

    def __init__(self) -> None:
        self._dirty: set[TraceWriter] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def mark(self, writer: TraceWriter) -> None:
        with self._wake:
            self._dirty.add(writer)
            if self._thread is None or not self._thread.is_alive():  # first use, or after fork
                self._thread = threading.Thread(target=self._run, daemon=True, name="trace-sync")
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._dirty:
                    self._wake.wait()
                batch, self._dirty = self._dirty, set()
            for writer in batch:
                try:
                    writer.sync()
                except (OSError, ValueError):  # closed meanwhile: close() synced it
                    pass


_SYNCER = _Syncer()


def read_trace(path: str | Path) -> list[dict]:
    """Every complete event of a trace. A last line cut by a crash mid-write is skipped."""
    events = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    raise ValueError(f"{path}:{n} is not a JSON trace event") from None
                continue
            if not isinstance(event, dict):
                raise ValueError(f"{path}:{n} is not a JSON trace event (not an object)")
            events.append(event)
    return events


def read_events(path: str | Path) -> list[Event]:
    """Every complete event of a trace, parsed (agent.events: an unknown type is kept as an
    UnknownEvent, not an error)."""
    return [Event.from_json(record) for record in read_trace(path)]


def all_inputs(events: list[Event]) -> list[dict]:
    """Every input of a trace: the session's, then those added later (the uploads of a
    served session); {"name", "path", "size", "sha256"} each."""
    items = []
    for event in events:
        match event:
            case SessionStarted() | InputsAdded():
                items += event.input_items()
    return items


def _plain(value: object) -> object:
    """JSON for what the trace carries beyond plain types (Executions, paths, dataclasses)."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return vars(value)
    return repr(value)
