"""Where names from a client meet paths on disk: upload names, downloads confined to the
session folder, the listing, and putting collected files back into a fresh sandbox."""

from __future__ import annotations

import hashlib
import mimetypes
import os
import secrets
import stat
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from sandcell.agent.session import FIGURES_DIR, OUTPUT_DIR, WORKSPACE_DIR, collected_place
from sandcell.sandbox.boundary import WORKSPACE
from sandcell.tools.paths import Refused, open_confined

INPUTS_DIR = "inputs"  # the session's uploads, each mounted at /data/<name>
KINDS = {
    INPUTS_DIR: "input",
    OUTPUT_DIR: "output",
    FIGURES_DIR: "figure",
    WORKSPACE_DIR: "workspace",
}
MAX_NAME_BYTES = 255  # what a Linux file name can hold
CHUNK = 1 << 16


class BadName(ValueError):
    """An upload's name cannot be used; the message says why (a 400)."""


class OverBudget(RuntimeError):
    """A user's files would pass their disk budget (--max-user-mb); a 507."""


def clean_name(raw: str | None) -> str:
    """The file name an upload gets under /data. A path is cut to its last part (browsers
    and some clients send one); a name that is empty, hidden, `..` or holds control
    characters is refused rather than guessed at."""
    name = (raw or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise BadName(f"the file name {raw!r} holds control characters; rename the file")
    if not name or name in (".", ".."):
        raise BadName(f"the upload's file name {raw!r} is empty once its folders are cut")
    if name.startswith("."):
        raise BadName(f"the file name {name!r} starts with '.'; hidden files are not taken")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise BadName(f"the file name is longer than {MAX_NAME_BYTES} bytes; shorten it")
    return name


def save_upload(source: BinaryIO, folder: Path, name: str, max_bytes: int | None = None) -> Path:
    """Write an upload to folder/name, whole or not at all (a temp file renamed into place);
    never over a file already there. Past max_bytes, OverBudget and nothing is kept."""
    handle, tmp = tempfile.mkstemp(prefix=".upload-", dir=folder)
    try:
        # readable by the sandbox's user: its /data is a hard link to this very file
        os.fchmod(handle, 0o444)
        written = 0
        with os.fdopen(handle, "wb") as out:
            while chunk := source.read(CHUNK):
                written += len(chunk)
                if max_bytes is not None and written > max_bytes:
                    raise OverBudget(f"{name} is over the {max_bytes} bytes left")
                out.write(chunk)
        target = folder / name
        os.link(tmp, target)  # fails if the name is taken: nothing is overwritten
        return target
    finally:
        os.unlink(tmp)


def parts_of(path: str) -> tuple[str, ...] | None:
    """The parts of a download path relative to the session folder; None for anything that
    is not a plain relative path (absolute, `..`, hidden parts, control characters)."""
    if not path or path.startswith("/"):
        return None
    parts = tuple(path.split("/"))
    for part in parts:
        if not part or part.startswith(".") or any(unicodedata.category(c) == "Cc" for c in part):
            return None
    return parts


def open_download(folder: Path, path: str) -> tuple[BinaryIO, int] | None:
    """A regular file under the session folder, opened without following any link; its size.
    None for everything else, so every refusal looks the same to the client (a 404)."""
    parts = parts_of(path)
    if parts is None:
        return None
    try:
        fd, st = open_confined(folder, parts, path)
    except Refused:
        return None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), st.st_size


def media_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def chunks(f: BinaryIO) -> Iterator[bytes]:
    with f:
        while chunk := f.read(CHUNK):
            yield chunk


def listing(folder: Path) -> list[dict]:
    """The session's files by kind: inputs, outputs, figures, other workspace files. Links
    and hidden names are left out, as downloads refuse them."""
    found = []
    for top, kind in KINDS.items():
        for rel, size in walk(folder / top, top):
            found.append({"path": rel, "kind": kind, "size": size})
    return found


def walk(root: Path, rel: str) -> Iterator[tuple[str, int]]:
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.name.startswith(".") or entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from walk(Path(entry.path), f"{rel}/{entry.name}")
        elif entry.is_file(follow_symlinks=False):
            yield f"{rel}/{entry.name}", entry.stat(follow_symlinks=False).st_size


def collected(folder: Path) -> Iterator[tuple[Path, str]]:
    """Files a session brought back from its workspace, each with its path in a sandbox
    (the reverse of Session.collect), to put back into a fresh one."""
    for top in (OUTPUT_DIR, FIGURES_DIR, WORKSPACE_DIR):
        for rel, _ in walk(folder / top, top):
            inside = rel.partition("/")[2] if top == WORKSPACE_DIR else rel
            yield folder / rel, f"{WORKSPACE}/{inside}"


def collect_target(folder: Path, name: str) -> Path:
    """Where Session.collect puts a workspace file."""
    root, rel = collected_place(name)
    return folder / root / rel


def disk_usage(root: Path, skip: Path | None = None) -> int:
    """Bytes of the regular files under root (links not followed, folder skip left out),
    each inode once: hard links share their bytes."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, dirs, names in os.walk(root):
        if skip is not None:
            dirs[:] = [d for d in dirs if Path(top, d) != skip]
        for name in names:
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:  # removed meanwhile (a temp file)
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def link_duplicates(root: Path, names: list[str]) -> None:
    """Make files under root with the same bytes one file, hard links of each other. The
    workspace's tar sends a hard link as a plain file: a figure linked a thousand times in
    the sandbox would otherwise be a thousand copies on the host."""
    by_size: dict[int, list[Path]] = {}
    for name in names:
        path = root / name
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and st.st_size:
            by_size.setdefault(st.st_size, []).append(path)
    for same_size in by_size.values():
        first_of: dict[str, Path] = {}
        for path in same_size if len(same_size) > 1 else ():
            first = first_of.setdefault(_digest(path), path)
            if first != path:
                tmp = path.parent / f".link-{secrets.token_hex(8)}"  # any name's length
                os.link(first, tmp)
                os.replace(tmp, path)


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
