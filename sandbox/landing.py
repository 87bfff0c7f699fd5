"""Where files from a sandbox land on the host. The names inside a workspace archive are
hostile (model code can write into the file helper's stream), so nothing here trusts them:
only the regular files on disk in a private staging folder are moved, each to a path checked
to stay inside its target folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath


def files_in(folder: Path) -> list[str]:
    """The regular files under folder as relative POSIX paths, sorted; a symlink is neither
    followed nor listed, nor is anything that is not a plain file."""
    found = []
    for root, _, names in os.walk(folder):  # followlinks=False: a linked folder is not entered
        for name in names:
            path = Path(root, name)
            if stat.S_ISREG(path.lstat().st_mode):
                found.append(path.relative_to(folder).as_posix())
    return sorted(found)


def move_inside(source: Path, root: Path, rel: str) -> Path:
    """Move source to root/rel, making folders as needed; PermissionError when rel would land
    outside root (absolute, `..`, or through a symlink), and the OSError of the move (a
    folder where a file goes, a file where a folder goes) as it is. The path it landed on."""
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise PermissionError(f"{rel!r} is not a plain relative path: not copied")
    root.mkdir(parents=True, exist_ok=True)
    here = root
    for part in parts[:-1]:  # one folder at a time: never through a link
        here = here / part
        if here.is_symlink():
            raise PermissionError(f"{rel}: {here} is a symlink: not copied")
        here.mkdir(exist_ok=True)  # FileExistsError: a file is there
    target = here / parts[-1]
    if not target.parent.resolve().is_relative_to(root.resolve()):
        raise PermissionError(f"{rel} would land outside {root}: not copied")
    os.replace(source, target)  # a symlink at target is replaced, never followed
    return target
