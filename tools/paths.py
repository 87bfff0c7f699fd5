"""Path confinement for file metadata.

A model names files as the sandbox sees them: /data/<input> (read-only inputs, each mounted
on its own) and /workspace/... (a tmpfs inside the container). Requests are parsed by
components (so /data2 is not /data), `..` is refused outright, and host files are opened one
component at a time relative to a directory fd with O_NOFOLLOW, so no symlink is ever
followed, not even one swapped in between a check and the open: the open IS the check.
Opening uses O_NONBLOCK and the kind of file is read from fstat of the opened fd, so a FIFO
or a device is refused without ever blocking on it.

Not covered: a hard link inside a directory input to a file outside it is that file; only
the host user who chose the input can make one.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandcell.sandbox.boundary import kind_of
from sandcell.tools.registry import ToolError

INPUT_ROOT = "data"
WORKSPACE_ROOT = "workspace"
MAX_PATH_CHARS = 4096
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_KIND_WORDS = {
    "fifo": "a FIFO (named pipe)",
    "char": "a character device",
    "block": "a block device",
    "socket": "a socket",
    "symlink": "a symbolic link",
    "other": "a special file",
}


class Refused(ToolError):
    """A path the tool will not open; `reason` is "missing", "symlink", "special" or "denied"."""

    def __init__(self, message: str, reason: str = "denied"):
        super().__init__(message)
        self.reason = reason


class FileSource(Protocol):
    """Files inside the sandbox (the workspace). `read` must not follow symlinks and must not
    block on FIFOs; DockerSandbox and DirSource do both."""

    def stat(self, path: str) -> dict: ...  # {"path", "size", "mtime", "kind"}

    def read(self, path: str, max_bytes: int | None = None) -> bytes: ...


@dataclass(frozen=True)
class Target:
    area: str  # "data" or "workspace"
    parts: tuple[str, ...]  # components below the area root; for data, parts[0] is the input

    @property
    def shown(self) -> str:
        return "/" + "/".join((self.area, *self.parts))


def refuse_kind(shown: str, kind: str) -> Refused:
    return Refused(
        f"{shown} is {_KIND_WORDS.get(kind, kind)}; only regular files and directories "
        "are profiled (special files could block or never end)",
        "special",
    )


def parse_request(path: str, input_names: Iterable[str]) -> Target:
    """Turn what the model wrote into a Target, or refuse with what to write instead."""
    names = set(input_names)
    if not isinstance(path, str) or not path.strip():
        raise ToolError("the path is empty; give a file such as /data/<name> or /workspace/<name>")
    if "\x00" in path or len(path) > MAX_PATH_CHARS:
        raise ToolError(
            "the path has a zero byte or is over 4096 characters; give a plain file path"
        )
    raw = path.strip()
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ToolError(
            f"`..` is not allowed in {raw!r}; name the file directly, e.g. {_examples(names)}"
        )
    if raw.startswith("/"):
        if not parts or parts[0] not in (INPUT_ROOT, WORKSPACE_ROOT):
            raise ToolError(
                f"{raw} is outside the sandbox's files; only /data (the input files) "
                f"and /workspace can be inspected, e.g. {_examples(names)}"
            )
        return Target(parts[0], tuple(parts[1:]))
    if not parts:  # "." or "./": the workspace itself
        return Target(WORKSPACE_ROOT, ())
    if parts[0] == INPUT_ROOT and len(parts) > 1 and parts[1] in names:
        return Target(INPUT_ROOT, tuple(parts[1:]))
    if parts[0] in names:  # a bare input name: the file the model was told about
        return Target(INPUT_ROOT, tuple(parts))
    if parts[0] == WORKSPACE_ROOT:
        parts = parts[1:]
    return Target(WORKSPACE_ROOT, tuple(parts))  # relative paths are the kernel's working dir


def _examples(names: set[str]) -> str:
    first = sorted(names)[:2]
    return ", ".join(f"/data/{n}" for n in first) + (" or " if first else "") + "/workspace/<file>"


def open_confined(root: Path, parts: tuple[str, ...], shown: str) -> tuple[int, os.stat_result]:
    """Open root/parts[0]/... without following any symlink below root; returns (fd, fstat).
    `root` itself was resolved when the inputs were given; O_NOFOLLOW catches a later swap."""
    try:
        fd = os.open(root, _OPEN_FLAGS)
    except OSError as exc:
        raise _os_refusal(exc, shown) from None
    try:
        for i, part in enumerate(parts):
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                raise Refused(
                    f"{shown} does not exist: {'/'.join(parts[:i]) or 'its parent'} is a "
                    "file, not a directory",
                    "missing",
                )
            try:
                nxt = os.open(part, _OPEN_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _os_refusal(exc, shown) from None
            os.close(fd)
            fd = nxt
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def _os_refusal(exc: OSError, shown: str) -> Refused:
    if exc.errno == errno.ELOOP:
        return Refused(
            f"{shown} is or passes through a symbolic link; links are not followed. "
            "Give the real file's path.",
            "symlink",
        )
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return Refused(
            f"{shown} does not exist; check the name (inputs are listed under /data)", "missing"
        )
    if exc.errno == errno.ENXIO:
        return refuse_kind(shown, "socket")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Refused(f"{shown} cannot be read: permission denied")
    return Refused(f"{shown} cannot be opened: {exc.strerror}")


def read_fd(fd: int, limit: int, deadline: float) -> bytes:
    """Read up to `limit` bytes, in chunks, giving up at the deadline (slow filesystems)."""
    chunks, left = [], limit
    while left > 0:
        if time.monotonic() > deadline:
            raise ToolError("reading the file took too long; it may be on a slow or remote disk")
        try:
            chunk = os.read(fd, min(left, 1 << 20))
        except BlockingIOError:
            raise ToolError("the file would block on read; it is not a regular file") from None
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def list_dir_fd(fd: int, limit: int = 50) -> list[str]:
    """Entry names of an opened directory (symlinks and special files are marked, not followed)."""
    out: list[str] = []
    with os.scandir(fd) as it:
        for entry in it:
            if len(out) >= limit:
                out.append("...")
                break
            mark = (
                "/"
                if entry.is_dir(follow_symlinks=False)
                else (
                    "@"
                    if entry.is_symlink()
                    else ""
                    if entry.is_file(follow_symlinks=False)
                    else " (special)"
                )
            )
            out.append(entry.name + mark)
    return sorted(out)


class DirSource:
    """A FileSource over a host directory (a local workspace, and the tests' stand-in for the
    container's), with the same confinement as the inputs."""

    def __init__(self, root: str | Path, mount: str = "/" + WORKSPACE_ROOT):
        self.root = Path(root).resolve()
        self.mount = mount.rstrip("/")

    def _parts(self, path: str) -> tuple[str, ...]:
        rel = (
            path[len(self.mount) :]
            if path == self.mount or path.startswith(self.mount + "/")
            else path
        )
        if path.startswith("/") and rel == path:
            raise PermissionError(f"{path} is outside {self.mount}")
        parts = tuple(p for p in rel.split("/") if p not in ("", "."))
        if ".." in parts:
            raise PermissionError(f"{path}: `..` is not allowed")
        return parts

    def stat(self, path: str) -> dict:
        try:
            fd, st = open_confined(self.root, self._parts(path), path)
        except Refused as exc:
            if exc.reason not in ("missing", "symlink"):
                raise PermissionError(str(exc)) from None
            return {"path": path, "kind": exc.reason}
        os.close(fd)
        return {"path": path, "size": st.st_size, "mtime": st.st_mtime, "kind": kind_of(st.st_mode)}

    def read(self, path: str, max_bytes: int | None = None) -> bytes:
        try:
            fd, st = open_confined(self.root, self._parts(path), path)
        except Refused as exc:
            raise (FileNotFoundError if exc.reason == "missing" else PermissionError)(
                str(exc)
            ) from None
        try:
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(f"{path} is a directory")
            if not stat.S_ISREG(st.st_mode):
                raise PermissionError(f"{path} is not a regular file")
            limit = st.st_size if max_bytes is None else max_bytes
            return read_fd(fd, limit, time.monotonic() + 30)
        finally:
            os.close(fd)
