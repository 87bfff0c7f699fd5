"""The files a session's code made (its output/ and figures/ folders on the host), newest
first, and all of them as one zip streamed as it is written: the archive is never whole in
memory or on disk. Both are capped; what a cap leaves out is said, never silently dropped."""

from __future__ import annotations

import datetime as dt
import os
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandcell.agent.serve import files
from sandcell.agent.session import FIGURES_DIR, OUTPUT_DIR

MAX_LISTED = 200  # files in one listing (the newest); `total` counts them all
ZIP_MAX_FILES = 1000  # files in one "download all"; the newest are taken
ZIP_MAX_BYTES = 1 << 30  # their bytes before compression
LEFT_OUT = "NOT-INCLUDED.txt"  # written into a zip that a cap cut, saying what it left out


@dataclass(frozen=True)
class Made:
    path: str  # relative to the session folder: output/... or figures/...
    kind: str  # "output" or "figure"
    size: int
    modified: float  # seconds since the epoch


def made(folder: Path) -> list[Made]:
    """Every file under output/ and figures/, newest first (links and hidden names left
    out, as downloads refuse them)."""
    found = []
    for top in (OUTPUT_DIR, FIGURES_DIR):
        for rel, size in files.walk(folder / top, top):
            try:
                modified = os.lstat(folder / rel).st_mtime
            except FileNotFoundError:  # replaced meanwhile
                continue
            found.append(Made(rel, files.KINDS[top], size, modified))
    return sorted(found, key=lambda m: (-m.modified, m.path))


def as_json(m: Made, url: str) -> dict:
    when = dt.datetime.fromtimestamp(m.modified, dt.UTC).isoformat(timespec="seconds")
    return {"path": m.path, "kind": m.kind, "size": m.size, "modified": when, "url": url}


def zipped(found: list[Made]) -> tuple[list[Made], list[Made]]:
    """The files one zip takes (newest first, within ZIP_MAX_FILES and ZIP_MAX_BYTES) and
    those it leaves out."""
    taken: list[Made] = []
    left: list[Made] = []
    total = 0
    for m in found:
        if len(taken) < ZIP_MAX_FILES and total + m.size <= ZIP_MAX_BYTES:
            taken.append(m)
            total += m.size
        else:
            left.append(m)
    return taken, left


class _Pipe:
    """Where zipfile writes: each write kept until the response takes it. Not seekable, so
    zipfile writes data descriptors and never goes back."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:  # zipfile's writable file has one (it never closes a given file)
        pass

    def take(self) -> bytes:
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data


def zip_stream(folder: Path, taken: list[Made], left: list[Made]) -> Iterator[bytes]:
    """The zip of these files, a chunk at a time (at most a CHUNK of input is held). A file
    gone or changed into a link meanwhile is skipped, as a download would refuse it."""
    pipe = _Pipe()
    with zipfile.ZipFile(pipe, "w", zipfile.ZIP_DEFLATED) as archive:
        for m in taken:
            opened = files.open_download(folder, m.path)
            if opened is None:
                continue
            source, _ = opened
            info = zipfile.ZipInfo(m.path, time.localtime(m.modified)[:6])
            info.compress_type = zipfile.ZIP_DEFLATED
            with source, archive.open(info, "w") as target:
                while chunk := source.read(files.CHUNK):
                    target.write(chunk)
                    if data := pipe.take():
                        yield data
            yield pipe.take()
        if left:
            note = (
                f"{len(left)} file(s) were left out of this zip: past its cap of "
                f"{ZIP_MAX_FILES} files or {ZIP_MAX_BYTES >> 20} MiB. Download them one by one "
                "from the page's file list or GET /api/sessions/{id}/files/{path}:\n"
            )
            archive.writestr(LEFT_OUT, note + "".join(f"{m.path}\n" for m in left))
    yield pipe.take()
