"""A session's input files, checked and described once.

`Inputs.from_paths` is the one place that turns what a user passed (`--input`, a jobs file,
an API call) into inputs: each gets its name inside the sandbox (/data/<name>), its absolute
host path, size and sha256. The sandbox mounts from it, the file-metadata tool and the
prompt's profiles answer from it (a profile is built once per unchanged file), and the trace
records it, so `replay` can tell when an input changed.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sandcell.sandbox.boundary import DATA


class InputError(ValueError):
    """An input cannot be used (missing, not a regular file, a name taken twice): a usage
    error, and the message says what to pass instead."""


@dataclass(frozen=True)
class Input:
    name: str  # the file name under /data
    path: Path  # absolute host path
    size: int | None = None  # None (and no sha256) for what is not a regular file

    @property
    def sandbox_path(self) -> str:
        return f"{DATA}/{self.name}"

    @functools.cached_property
    def sha256(self) -> str | None:
        """Read on first use (the trace asks for it): checking a jobs file hashes nothing."""
        return None if self.size is None else sha256_of(self.path)

    def to_dict(self) -> dict:
        return {"name": self.name, "path": str(self.path), "size": self.size, "sha256": self.sha256}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Inputs:
    """The inputs of one session, in the order given; iterate for `Input`s."""

    def __init__(self, items: Iterable[Input] = ()):
        self._items = {item.name: item for item in items}
        self._profiles: dict[str, tuple[object, object]] = {}  # name -> (file identity, profile)
        self._lock = threading.Lock()

    @classmethod
    def from_paths(
        cls,
        paths: Inputs | Mapping[str, str | Path] | Iterable[str | Path],
        files_only: bool = True,
    ) -> Inputs:
        """Paths (named by their base name) or {name: path}. `files_only=False` is for the
        file-metadata tool used on its own, which also lists folders and refuses special files
        itself when they are opened; a sandbox mounts regular files only."""
        if isinstance(paths, Inputs):
            return paths
        if isinstance(paths, Mapping):
            named = list(paths.items())
        else:
            named = [(Path(p).name, p) for p in paths]
        items: dict[str, Input] = {}
        for name, raw in named:
            if not name or "/" in name or name in (".", ".."):
                raise InputError(f"input name {name!r} must be a plain file name")
            if name in items:
                raise InputError(
                    f"two inputs are named {name} ({items[name].path} and {raw}); each is "
                    f"mounted as {DATA}/<file name>, so rename or copy one of them"
                )
            path = Path(raw).expanduser().absolute()
            items[name] = _describe(name, path, files_only, raw)
        return cls(items.values())

    def __iter__(self) -> Iterator[Input]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    @property
    def names(self) -> list[str]:
        return list(self._items)

    def get(self, name: str) -> Input | None:
        return self._items.get(name)

    def mounts(self) -> dict[str, Path]:
        """{name under /data: host path}, as the sandbox mounts them."""
        return {item.name: item.path for item in self}

    def to_trace(self) -> list[dict]:
        return [item.to_dict() for item in self]

    def profile(self, name: str, identity: object, build: Callable[[], object]) -> object:
        """The profile of input `name` while its file keeps `identity` (device, inode, size,
        times); built by `build` the first time, and again only when the file changed."""
        with self._lock:
            cached = self._profiles.get(name)
            if cached is not None and cached[0] == identity:
                return cached[1]
            value = build()  # under the lock: two threads never profile the same file twice
            self._profiles[name] = (identity, value)
            return value

    def extended(self, more: Inputs) -> Inputs:
        """These inputs and `more` (a pool sandbox given its files later)."""
        clash = set(self._items) & set(more._items)
        if clash:
            raise InputError(f"an input named {sorted(clash)[0]} is there already")
        return Inputs([*self, *more])


def _describe(name: str, path: Path, files_only: bool, raw: object) -> Input:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"input {raw} does not exist; pass an existing file") from None
    except OSError as error:
        raise InputError(f"input {raw} cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        if files_only:
            raise InputError(
                f"input {raw} is not a regular file (a folder, device or pipe); pass files "
                "only, one --input each"
            )
        return Input(name, path.resolve())
    if not os.access(path, os.R_OK):
        raise InputError(f"input {raw} cannot be read: permission denied")
    return Input(name, path.resolve(), st.st_size)
