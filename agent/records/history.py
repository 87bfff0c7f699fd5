"""history.json beside a session's trace: the conversation after the system prompt, as of its
last question, so a session continued later (a restarted server, `chat --resume`) goes on
with what the model had been told and had said."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
HISTORY = "history.json"


def save(folder: Path, messages: list[dict]) -> None:
    """The conversation after the system prompt, whole or not at all."""
    tmp = folder / f".{HISTORY}.tmp"
    tmp.write_text(json.dumps(messages[1:], ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, folder / HISTORY)


def load(folder: Path) -> list[dict]:
    """The saved conversation; empty when none was saved or it cannot be read (a warning)."""
    path = folder / HISTORY
    try:
        messages = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []  # no question finished
    except (OSError, ValueError) as error:
        log.warning("%s cannot be read (%s): the session goes on without its history", path, error)
        return []
    ok = isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages)
    return messages if ok else []
