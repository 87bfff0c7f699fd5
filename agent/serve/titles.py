"""A session's title: the one its user gave it (`PATCH /api/sessions/{id}`), kept in its
folder so it outlives a restart of the server, or else its first question."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

TITLE_FILE = "title.txt"
MAX_TITLE = 200  # characters of a title given; a first question is cut to this too


def clean(text: str) -> str:
    """One line of at most MAX_TITLE characters: control characters (newlines too) become
    spaces, runs of spaces one."""
    spaced = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    return " ".join(spaced.split())[:MAX_TITLE]


def read(folder: Path) -> str | None:
    try:
        return clean(Path(folder, TITLE_FILE).read_text(encoding="utf-8")) or None
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def save(folder: Path, title: str) -> str:
    """Keep the title, whole or not at all; the title as kept."""
    title = clean(title)
    tmp = Path(folder, f".{TITLE_FILE}.tmp")
    tmp.write_text(title, encoding="utf-8")
    os.replace(tmp, Path(folder, TITLE_FILE))
    return title
