"""The file_metadata tool and the input-file profiles of the agent's system prompt.

Host inputs are read through tools.paths (confined, no symlinks, no special files); workspace
files through a FileSource (the sandbox runs the reads inside the container). Both feed the
same tools.profile, so a file gets the same answer wherever it lives.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from sandcell.sandbox.inputs import Inputs
from sandcell.tools.paths import (
    INPUT_ROOT,
    FileSource,
    Refused,
    Target,
    kind_of,
    list_dir_fd,
    open_confined,
    parse_request,
    read_fd,
    refuse_kind,
)
from sandcell.tools.profile import (
    DEFAULT_CAPS,
    Caps,
    Profile,
    build_profile,
    error_text,
    human_size,
    render,
)
from sandcell.tools.registry import LRU, Spec, Tool, ToolError, ToolOutcome

_CACHE_SIZE = 128

# Said once for every front end: that the agent's prompt profiles its inputs already is said
# by that prompt (profile_inputs' header), not here, since an MCP client gets no such profiles.
SPEC = Spec(
    name="file_metadata",
    description=(
        "Profile one file without loading it: type, size, encoding, delimiter, rows, column "
        "types, nulls, first rows. For files in /data or /workspace whose layout you do not "
        "know yet; not for statistics: use python."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "/data/<name> or a /workspace path"},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
)


InputsLike = Inputs | Mapping[str, str | Path] | Iterable[str | Path]
_CacheKey = tuple[str, int, int, int, int, int] | tuple[str, str, object, object]


class FileMetadata:
    def __init__(
        self,
        inputs: InputsLike = (),
        workspace: FileSource | None = None,
        caps: Caps = DEFAULT_CAPS,
    ):
        # A session's Inputs as they are (their profiles are shared with the prompt); plain
        # paths or {name: path} when the tool is used on its own.
        self.inputs = Inputs.from_paths(inputs, files_only=False)
        self.workspace = workspace
        self.caps = caps
        # profiles of unchanged files inside folder inputs (the path shown and the file's
        # identity) and in the workspace ("workspace", the path, its size and mtime as stat'ed)
        self._cache: LRU[_CacheKey, Profile] = LRU(_CACHE_SIZE)

    def describe(self, path: str) -> ToolOutcome:
        target = parse_request(path, self.inputs.names)
        if target.area == INPUT_ROOT:
            profile = self._input(target)
        else:
            profile = self._workspace(target)
        if isinstance(profile, str):
            return ToolOutcome(True, profile)
        return ToolOutcome(True, render(profile, self.caps), data=profile)

    # -- host inputs ---------------------------------------------------------------------
    def _input(self, target: Target) -> Profile | str:
        if not target.parts:
            return self.listing()
        item = self.inputs.get(target.parts[0])
        if item is None:
            raise Refused(
                f"there is no input named {target.parts[0]!r}; {self.listing()}", "missing"
            )
        fd, st = open_confined(item.path, target.parts[1:], target.shown)
        try:
            kind = kind_of(st.st_mode)
            if kind == "dir":
                entries = list_dir_fd(fd)
                return f"{target.shown}: directory, {len(entries)} entries: " + ", ".join(entries)
            if kind != "file":
                raise refuse_kind(target.shown, kind)
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            build = functools.partial(self._build, fd, st, target.shown)
            if len(target.parts) == 1:  # the input itself: its profile is kept with the inputs
                profile = self.inputs.profile(target.parts[0], identity, build)
                assert isinstance(profile, Profile)  # what a `build` here made: Inputs keeps it
                return profile
            key = (target.shown, *identity)
            return self._cache.get(key) or self._cache.put(key, build())
        finally:
            os.close(fd)

    def _build(self, fd: int, st: os.stat_result, shown: str) -> Profile:
        return _profile_fd(fd, st, shown, self.caps)

    def listing(self) -> str:
        if not self.inputs:
            return "there are no input files in this session"
        items = []
        for item in self.inputs:
            try:
                size = human_size(os.stat(item.path).st_size)
            except OSError:
                size = "unreadable"
            items.append(f"{item.sandbox_path} ({size})")
        return "input files (read-only): " + ", ".join(items)

    # -- workspace -----------------------------------------------------------------------
    def _workspace(self, target: Target) -> Profile | str:
        if self.workspace is None:
            raise ToolError(
                f"{target.shown}: there is no workspace here (no sandbox is running); "
                f"only the inputs can be inspected. {self.listing()}"
            )
        shown = target.shown
        info = self.workspace.stat(shown)
        kind = info.get("kind", "missing")
        if kind == "missing":
            raise Refused(
                f"{shown} does not exist; list the workspace with the python tool "
                "(os.listdir('/workspace'))",
                "missing",
            )
        if kind == "dir":
            return f"{shown}: directory; list it with the python tool (os.listdir)"
        if kind == "symlink":
            raise Refused(
                f"{shown} is a symbolic link; links are not followed. Give the real path.",
                "symlink",
            )
        if kind != "file":
            raise refuse_kind(shown, kind)
        key = ("workspace", shown, info.get("size"), info.get("mtime"))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        size = int(info.get("size") or 0)
        want = self.caps.full_bytes + 1 if size <= self.caps.full_bytes else self.caps.head_bytes
        try:
            data = self.workspace.read(shown, max_bytes=want)
        except FileNotFoundError:
            raise Refused(f"{shown} disappeared while it was being read", "missing") from None
        except (PermissionError, IsADirectoryError) as exc:
            raise ToolError(f"{shown} cannot be read: {exc}") from None
        complete = len(data) <= self.caps.full_bytes and len(data) < want
        size = len(data) if complete else max(size, len(data))
        profile = build_profile(
            shown, size, info.get("mtime"), data, complete=complete, caps=self.caps
        )
        return self._cache.put(key, profile)


def _profile_fd(fd: int, st: os.stat_result, shown: str, caps: Caps) -> Profile:
    complete = st.st_size <= caps.full_bytes
    limit = st.st_size if complete else caps.head_bytes
    data = read_fd(fd, limit, time.monotonic() + caps.time_s)
    complete = complete and len(data) == st.st_size  # a file that changed is not "whole"

    def reopen() -> io.BufferedReader:  # parquet and xlsx seek to their footer
        return os.fdopen(os.dup(fd), "rb")

    return build_profile(
        shown, st.st_size, st.st_mtime, data, complete=complete, caps=caps, open_file=reopen
    )


def profile_file(path: Path, shown: str, caps: Caps = DEFAULT_CAPS) -> Profile:
    """The profile of one host file, read as the tool reads an input (no symlink followed,
    regular files only, at most caps.full_bytes read); `shown` names it in the profile.
    Raises ToolError (a Refused) for what cannot be read, its message saying why."""
    fd, st = open_confined(path, (), shown)
    try:
        if kind_of(st.st_mode) != "file":
            raise refuse_kind(shown, kind_of(st.st_mode))
        return _profile_fd(fd, st, shown, caps)
    finally:
        os.close(fd)


def file_metadata_tool(
    inputs: InputsLike = (),
    workspace: FileSource | None = None,
    caps: Caps = DEFAULT_CAPS,
) -> Tool:
    """The tool over these inputs ({name: host path}, or paths named by basename, as the sandbox
    mounts them at /data/<name>) and, when a sandbox runs, its workspace."""
    fm = FileMetadata(inputs, workspace, caps)
    return Tool.of(
        SPEC,
        fm.describe,
        timeout_s=2 * caps.time_s
        + 10,  # reads and parsing stop at caps.time_s; this is the backstop
        cacheable=False,  # cached inside, by file identity and mtime: a changed file is re-read
    )


def profile_inputs(
    paths: InputsLike,
    caps: Caps = DEFAULT_CAPS,
    max_chars: int = 8000,
) -> str:
    """Compact profiles of the input files, for the agent's system prompt. Given a session's
    Inputs, the profiles are the ones the tool answers with: each file is read once.

    An input that cannot be profiled, for whatever reason (refused, unreadable, a profiler
    failure), is one line saying so; the others are profiled all the same."""
    fm = FileMetadata(paths, None, caps)
    if not fm.inputs:
        return "There are no input files."
    budget = max(600, max_chars // len(fm.inputs))
    fm.caps = dataclasses.replace(caps, max_chars=budget, identity=False)
    out = [
        "Input files (read-only, under /data; write outputs to /workspace), profiled already "
        "(file_metadata is for other files):"
    ]
    for item in fm.inputs:
        try:
            obs = fm.describe(item.sandbox_path)
        except ToolError as exc:  # a refusal (a FIFO, a link): its message says why
            out.append(f"{item.sandbox_path}: " + " ".join(str(exc).split()))
            continue
        except Exception as exc:  # one input must not take the whole prompt down
            out.append(f"{item.sandbox_path}: could not be profiled ({error_text(exc)})")
            continue
        error = getattr(obs.data, "error", None)
        if error:  # build_profile's last resort fired: its short form, not a bare header
            out.append(f"{item.sandbox_path}: could not be profiled ({error})")
        else:
            out.append(obs.text)
    text = "\n\n".join(out)
    if len(text) > max_chars:
        text = text[: max_chars - 50].rsplit("\n", 1)[0] + "\n... (profiles cut to fit)"
    return text
