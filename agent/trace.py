"""trace.jsonl: one JSON object a line, appended and flushed as each step happens, so a crash
loses no finished step. Event types: session, question, step, protocol, final."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import IO, Any, Self


class TraceWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, type_: str, **fields: Any) -> None:
        if self._file is None:
            raise ValueError(f"the trace {self.path} is closed")
        event = {
            "type": type_,
            "time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        }
        event.update(fields)
        self._file.write(json.dumps(event, ensure_ascii=False, default=_plain) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())  # a machine crash keeps finished steps too

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def observation_record(action: Any, obs: Any) -> dict:
    """One action and its observation as the trace keeps them (the Execution in full)."""
    execution = obs.data.to_dict() if hasattr(obs.data, "to_dict") else None
    return {"tool": action.tool, "args": action.args, "call_id": action.call_id, "how": action.how,
            "ok": obs.ok, "text": obs.text, "execution": execution}  # fmt: skip


def read_trace(path: str | Path) -> list[dict]:
    """Every complete event of a trace. A last line cut by a crash mid-write is skipped."""
    events = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    raise ValueError(f"{path}:{n} is not a JSON trace event") from None
    return events


def _plain(value: object) -> object:
    """JSON for what the trace carries beyond plain types (Executions, paths, dataclasses)."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dataclass_fields__"):
        return vars(value)
    return repr(value)
