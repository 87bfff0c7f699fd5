"""A job's layout: what its inputs look like, without their values.

An input's fingerprint comes from the profile the file-metadata tool already makes: its
format, encoding, delimiter, header row, column names and count. Value kinds (int, float,
text, empty) are left out: an empty column, or ints one month and floats the next, must not
split one vendor's exports apart. A job's layout is the ordered list of its inputs'
fingerprints; files of one layout are what one recipe can clean."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from sandcell.tools.file_metadata import profile_file
from sandcell.tools.profile import Caps

# Only the head is read: a layout needs the header and a few rows, never the whole file.
CAPS = Caps(head_bytes=256 << 10, full_bytes=256 << 10, time_s=2.0, max_columns=200)
CLOSE = 0.6  # a layout at least this close to a job's may hold a recipe worth trying
ASCII = "ascii"  # text with no byte over 127: readable as any ASCII-compatible encoding


@dataclass(frozen=True)
class Fingerprint:
    """One input's shape."""

    kind: str  # csv, tsv, json, jsonl, parquet, xlsx, text, binary, empty, unknown
    encoding: str | None
    delimiter: str | None
    header: bool | None
    columns: tuple[str, ...]  # as profiled (the first Caps.max_columns of them)
    width: int  # how many columns in all

    @classmethod
    def of(cls, path: Path) -> Fingerprint:
        """The fingerprint of a host file; one the profiler cannot read is kind "unknown"."""
        try:
            p = profile_file(path, f"/data/{path.name}", CAPS)
        except Exception:  # a refusal (not a regular file) or an unreadable file
            return cls("unknown", None, None, None, (), 0)
        encoding = p.encoding
        if encoding and "ASCII only" in encoding:
            encoding = ASCII
        columns = tuple(c.name for c in p.columns)
        return cls(p.kind, encoding, p.delimiter, p.header, columns, p.column_count or len(columns))

    @classmethod
    def from_dict(cls, raw: dict) -> Fingerprint:
        return cls(
            str(raw["kind"]),
            raw.get("encoding"),
            raw.get("delimiter"),
            raw.get("header"),
            tuple(str(c) for c in raw.get("columns", [])),
            int(raw.get("width", 0)),
        )

    def closeness(self, other: Fingerprint) -> float:
        """1.0 for the same shape, 0.0 for another format; in between, the share of column
        names both have (case and spaces aside), less a little for each other reading
        setting (encoding, delimiter, header row)."""
        if self.kind != other.kind:
            return 0.0
        if self == other:
            return 1.0
        mine, theirs = _names(self.columns), _names(other.columns)
        shared = len(mine & theirs) / len(mine | theirs) if mine | theirs else 1.0
        differing = sum(
            (
                not _same_encoding(self.encoding, other.encoding),
                self.delimiter != other.delimiter,
                self.header != other.header,
            )
        )
        return max(0.0, shared - 0.1 * differing)


@dataclass(frozen=True)
class Layout:
    """A job's inputs' fingerprints, in the order of its jobs-file entry."""

    inputs: tuple[Fingerprint, ...]

    @classmethod
    def of(cls, paths: list[Path]) -> Layout:
        return cls(tuple(Fingerprint.of(Path(p)) for p in paths))

    @classmethod
    def from_json(cls, text: str) -> Layout:
        raw = json.loads(text)
        if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
            raise ValueError("a layout is a JSON list of input fingerprints")
        return cls(tuple(Fingerprint.from_dict(r) for r in raw))

    def to_json(self) -> str:
        """One line of JSON (a recipe's header holds it)."""
        return json.dumps([asdict(f) for f in self.inputs], ensure_ascii=True)

    @property
    def key(self) -> str:
        """A short name for the layout: the same inputs' shape gives the same key."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    def closeness(self, other: Layout) -> float:
        """How alike two layouts are, 0..1: the least alike of their inputs, pair by pair (a
        recipe reads each input by its place); 0 for another number of inputs."""
        if len(self.inputs) != len(other.inputs):
            return 0.0
        if not self.inputs:
            return 1.0
        return min(a.closeness(b) for a, b in zip(self.inputs, other.inputs, strict=True))

    def describe(self) -> str:
        """For a person: `csv ; 5 columns (id, amount, ...)` for each input."""
        return " + ".join(_described(f) for f in self.inputs) or "no inputs"


def _names(columns: tuple[str, ...]) -> set[str]:
    return {" ".join(c.lower().split()) for c in columns}


def _same_encoding(a: str | None, b: str | None) -> bool:
    return a == b or ASCII in (a, b)  # ASCII text reads the same in either


def _described(f: Fingerprint) -> str:
    if not f.columns:
        return f.kind
    shown = ", ".join(f.columns[:4]) + (", ..." if f.width > 4 else "")
    sep = f" {f.delimiter!r}" if f.delimiter not in (None, ",", "\t") else ""
    return f"{f.kind}{sep}, {f.width} columns ({shown})"
