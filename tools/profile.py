"""Profile one file from (name, size, mtime, bytes) and render it as compact text.

The caller reads the bytes (a prefix, or the whole file when it is small) through whatever
confinement applies; this module never touches the filesystem, so host inputs and workspace
files get the same answer.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import logging
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import BinaryIO

from sandcell.tools import formats, tables
from sandcell.tools.formats import Column

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caps:
    head_bytes: int = 1 << 20  # always read: type, encoding, sample rows, estimates
    full_bytes: int = 16 << 20  # files up to this are read whole: exact counts and sha256
    time_s: float = 5.0  # parsing stops here; counts are then marked as estimates
    max_columns: int = 40  # columns listed in the rendered text
    max_chars: int = 3000  # one rendered profile
    identity: bool = True  # show modification time and sha256 (not needed in a prompt)
    # distinct values held per column, and rows held to find duplicates (CSV/TSV and JSON
    # records); 0: not counted (a prompt needs no such counts; the job audit does)
    distinct: int = 0


DEFAULT_CAPS = Caps()


@dataclass
class Profile:
    name: str
    size: int
    mtime: float | None
    kind: str  # csv, tsv, json, jsonl, parquet, xlsx, text, binary, empty, unknown (error)
    sha256: str | None = None
    encoding: str | None = None
    delimiter: str | None = None
    header: bool | None = None
    rows: int | None = None
    rows_exact: bool = True
    rows_at_least: bool = False  # text ended early (zero padding): no extrapolation to the size
    columns: list[Column] = field(default_factory=list)
    duplicate_rows: int | None = None  # rows equal to an earlier one (None: not counted)
    duplicates_more: bool = False  # rows past Caps.distinct were not held: a floor
    column_count: int | None = None  # all the columns, when `columns` lists only the first ones
    sample: list[list[str]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # "ErrorType: message" when the profiler itself failed


DELIMITED_EXTS = (".csv", ".tsv", ".tab", ".psv")
TEXT_TABLE_EXTS = (*DELIMITED_EXTS, ".txt")


def build_profile(
    name: str,
    size: int,
    mtime: float | None,
    data: bytes,
    *,
    complete: bool,
    caps: Caps = DEFAULT_CAPS,
    open_file: Callable[[], BinaryIO] | None = None,
) -> Profile:
    """`data` is the whole file when `complete`, else a prefix. `open_file` gives a seekable
    handle for formats whose metadata sits at the end (parquet, xlsx), when one is available.

    Never raises for any bytes: what a parser cannot read becomes a note. Should the profiler
    itself fail (a bug), the profile says so, with the error type, and `error` is set: one
    input must not stop a run before any code runs."""
    try:
        return _build(name, size, mtime, data, complete, caps, open_file)
    except Exception as exc:  # the last resort; the parsers below report what they can't read
        log.warning("profiling %s failed", name, exc_info=True)
        return _failed(name, size, mtime, exc)


def error_text(exc: BaseException, limit: int = 200) -> str:
    """`ErrorType: message` on one line, at most `limit` characters."""
    msg = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _failed(name: str, size: int, mtime: float | None, exc: Exception) -> Profile:
    p = Profile(name, size, mtime, "unknown", error=error_text(exc))
    p.notes.append(
        f"could not be profiled ({p.error}); nothing is known about its content: "
        "inspect it with the python tool"
    )
    return p


def _build(
    name: str,
    size: int,
    mtime: float | None,
    data: bytes,
    complete: bool,
    caps: Caps,
    open_file: Callable[[], BinaryIO] | None,
) -> Profile:
    deadline = time.monotonic() + caps.time_s
    p = Profile(name, size, mtime, "binary")
    ext = PurePosixPath(name).suffix.lower()
    if complete:
        p.sha256 = hashlib.sha256(data).hexdigest()
    else:
        p.notes.append(f"sha256 not computed: the file is over {human_size(caps.full_bytes)}")
    if size == 0:
        p.kind, p.rows = "empty", 0
        p.notes.append("the file is empty (0 bytes): there is nothing to read")
        return p
    magic = formats.sniff_magic(data)
    if magic == "parquet" or (
        magic == "zip archive" and (ext in (".xlsx", ".xlsm") or b"xl/" in data[:4096])
    ):
        _binary_table(
            p,
            "parquet" if magic == "parquet" else "xlsx",
            data,
            complete,
            caps,
            open_file,
            deadline,
        )
    elif magic:
        p.extra.append(f"content: {magic}")
    else:
        _text(p, data, complete, caps, deadline)
    if p.kind == "binary" and ext in (*TEXT_TABLE_EXTS, ".json", ".jsonl"):
        p.notes.append(
            f"named {ext} but the content is binary; pd.read_csv/open() will not read it "
            "as text. Check where the file came from."
        )
    return p


def _binary_table(
    p: Profile,
    kind: str,
    data: bytes,
    complete: bool,
    caps: Caps,
    open_file: Callable[[], BinaryIO] | None,
    deadline: float,
) -> None:
    p.kind = kind
    if open_file is None and not complete:
        p.notes.append(
            f"{kind} metadata not read: the file is over {human_size(caps.full_bytes)} and no "
            "seekable handle is available here; inspect it with the python tool"
        )
        return
    f = open_file() if open_file is not None else io.BytesIO(data)
    try:
        if kind == "parquet":
            info = formats.parquet_info(f, p.size, caps.full_bytes, caps.distinct)
        else:
            info = formats.xlsx_info(f, deadline, distinct=caps.distinct)
    except _corrupt_errors(kind) as exc:
        p.notes.append(f"could not read the {kind} metadata: {error_text(exc)}")
        return
    finally:
        f.close()
    p.rows, p.rows_exact, p.columns, p.sample = (
        info.rows,
        info.rows_exact,
        info.columns,
        info.sample,
    )
    p.header = True
    p.duplicate_rows = info.duplicate_rows
    p.extra += info.extra
    p.notes += info.notes


# What the readers of a damaged workbook or parquet file raise (seen fuzzing them): zipfile
# (BadZipFile, zlib.error, NotImplementedError for an unknown zip version, EOFError), the XML
# parser (ParseError, a SyntaxError), openpyxl (KeyError for a missing part, TypeError and
# ValueError for bad attributes, OSError for no workbook part) and pyarrow (ArrowInvalid and
# the other ArrowExceptions, OSError for undecodable thrift).
_CORRUPT = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    NotImplementedError,
    SyntaxError,
    KeyError,
    IndexError,
    TypeError,
    ValueError,
    OSError,
)


def _corrupt_errors(kind: str) -> tuple[type[BaseException], ...]:
    if kind != "parquet":
        return _CORRUPT
    import pyarrow  # loaded already: parquet_info imports it

    return (*_CORRUPT, pyarrow.ArrowException)


def _text(p: Profile, data: bytes, complete: bool, caps: Caps, deadline: float) -> None:
    enc = tables.detect_encoding(data, complete)
    nul = data.find(b"\x00")
    before_zeros = tables.detect_encoding(data[:nul], False) if enc is None and nul > 1024 else None
    if before_zeros is not None:
        # Text followed by zero bytes: a preallocated, sparse or truncated-and-padded file.
        p.notes.append(
            f"zero bytes from byte {nul:,} on: the file looks padded or corrupt; only the "
            "text before them was profiled"
        )
        data, complete, enc = data[:nul], False, before_zeros
        p.rows_exact, p.rows_at_least = False, True
    if enc is None:
        p.extra.append("content: binary data (zero bytes in the first 64 KiB)")
        return
    p.encoding = enc.label
    if enc.note:
        p.notes.append(enc.note)
    try:
        text = tables.decode(data, enc, complete)
    except UnicodeDecodeError as exc:
        # e.g. a cp1252 file with a byte cp1252 leaves undefined, or utf-16 of odd length
        text = tables.decode(data, enc, complete, errors="replace")
        p.notes.append(
            f"undecodable as {enc.codec} at byte {exc.start:,} ({exc.reason}); profiled with "
            f"the bad bytes replaced: read it with encoding='{enc.codec}', "
            "encoding_errors='replace'"
        )
    if _control_ratio(text[:65536]) > 0.05:
        p.encoding = None
        p.extra.append("content: binary data (many control characters)")
        return
    ext = PurePosixPath(p.name).suffix.lower()
    if _json(p, text, ext, complete, caps.distinct):
        return
    delimiter, width = tables.sniff_delimiter(text)
    if width > 1 or ext in DELIMITED_EXTS:
        _table(p, text, delimiter, complete, deadline, data, enc, caps.distinct)
    else:
        p.kind = "text"
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if p.rows_at_least:
            p.rows = lines
        else:
            p.rows, p.rows_exact = _rows(lines, complete, len(data), p.size)
        p.sample = [[line[:200]] for line in text.split("\n")[:3]]


def _table(
    p: Profile,
    text: str,
    delimiter: str,
    complete: bool,
    deadline: float,
    data: bytes,
    enc: tables.Encoding,
    distinct: int = 0,
) -> None:
    p.kind = "tsv" if delimiter == "\t" else "csv"
    p.delimiter = delimiter
    t = tables.parse_table(text, delimiter, deadline, complete, distinct)
    p.duplicate_rows, p.duplicates_more = t.duplicate_rows, t.duplicates_more
    p.header = t.header
    exact = complete and t.complete and p.rows_exact
    if t.stopped and t.rows == 0:
        pass  # nothing parsed: the row count is unknown, not zero
    elif exact or p.rows_at_least:
        p.rows = t.rows
    else:
        parsed = len(text[: t.chars_parsed].encode(enc.codec, "replace")) or len(data)
        # the header is not a row: left out of both sides (from a few rows it skews the guess)
        head = len(text[: text.find("\n") + 1].encode(enc.codec, "replace")) if t.header else 0
        head = min(head, parsed)
        p.rows, p.rows_exact = _rows(t.rows, False, parsed - head, p.size - head)
    note = "" if exact else f"in the first {t.rows:,} rows"
    for c in t.columns:
        detail = (
            f"{_num(c.minimum)}..{_num(c.maximum)}"
            if c.minimum is not None and c.kind in ("int", "float")
            else "e.g. " + " | ".join(c.examples)
            if c.examples
            else ""
        )
        counted = len(c.values) if c.values is not None else None
        p.columns.append(Column(c.name, c.kind, c.nulls, note, detail, counted, c.distinct_more))
    if t.width > len(t.columns):
        p.column_count = t.width
        p.notes.append(f"{t.width:,} columns: only the first {len(t.columns):,} were profiled")
    p.sample = t.sample
    if t.ragged:
        p.notes.append(
            f"ragged: {t.ragged:,} row(s) have a different number of fields "
            f"({t.first_ragged}); pandas may fail: try on_bad_lines='warn'"
        )
    if t.unclosed_quote:
        p.notes.append(
            f"the last record (from line {t.unclosed_quote:,}) has a quoted field that is never "
            "closed: csv reads the rest of the file as one field; pd.read_csv fails ('EOF "
            "inside string')"
        )
    if t.stopped:
        p.notes.append(t.stopped)


def _json(p: Profile, text: str, ext: str, complete: bool, distinct: int = 0) -> bool:
    head = text.lstrip()[:1]
    if ext not in (".json", ".jsonl", ".ndjson", ".geojson") and head not in ("{", "["):
        return False
    all_lines = text.split("\n")
    values = [_json_record(ln) for ln in all_lines[:50] if ln.strip()]  # each parsed once
    if ext in (".jsonl", ".ndjson") or (len(values) > 1 and None not in values):
        p.kind = "jsonl"
        records = [v for v in values if v is not None]
        n = sum(1 for ln in all_lines if ln.strip())
        p.rows, p.rows_exact = _rows(n, complete, len(text.encode()), p.size)
        _json_columns(p, records, complete, distinct)
        return True
    p.kind = "json"
    if not complete:
        p.notes.append("too large to parse whole here; load it with the python tool")
        p.sample = [[text[:200]]]
        return True
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        p.notes.append(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
        return True
    except ValueError as exc:  # e.g. an integer over Python's 4,300-digit conversion limit
        p.notes.append(f"Python's json cannot load it: {error_text(exc)}")
        return True
    except RecursionError:
        p.notes.append(
            "nested too deeply for Python's json to load (RecursionError); "
            "read it with the python tool"
        )
        return True
    if isinstance(value, list):
        p.rows = len(value)
        _json_columns(p, value[:1000], True, distinct)
    elif isinstance(value, dict):
        p.extra.append("top level: object with keys " + ", ".join(k[:40] for k in list(value)[:20]))
    return True


def _json_record(line: str) -> dict | list | None:
    """The line's JSON object or array; None for anything else."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, an over-long integer, nested too deep
        return None
    return value if isinstance(value, (dict, list)) else None


_JSON_KINDS = {
    str: "string",
    bool: "bool",
    int: "int",
    float: "float",
    list: "array",
    dict: "object",
}


def _json_columns(p: Profile, records: list, complete: bool, distinct: int = 0) -> None:
    dicts = [r for r in records if isinstance(r, dict)]
    keys: dict[str, set[str]] = {}
    for r in dicts:
        for k, v in r.items():
            kinds = keys.setdefault(k, set())
            if v is not None:
                kinds.add(_JSON_KINDS.get(type(v), type(v).__name__))
    note = "" if complete and len(records) == p.rows else f"in the first {len(dicts):,} records"
    for k, kinds in list(keys.items())[:200]:
        nulls = sum(1 for r in dicts if r.get(k) is None)
        kind = "float" if kinds == {"int", "float"} else "/".join(sorted(kinds)) or "null"
        p.columns.append(Column(k, kind, nulls, note))
    if distinct:  # over the same records as the nulls (the note says which)
        _json_distinct(p, dicts, distinct)
    p.sample = [[_json_text(r)] for r in records[:3]]


def _json_distinct(p: Profile, records: list[dict], cap: int) -> None:
    """Distinct values per key and duplicate records, as tables.parse_table counts them."""
    for c in p.columns:
        seen = {_json_key(r[c.name]) for r in records if r.get(c.name) is not None}
        c.distinct, c.distinct_more = min(len(seen), cap), len(seen) > cap
    keys = [_json_key(r) for r in records]
    p.duplicate_rows = len(keys) - len(set(keys))


def _json_key(value: object) -> str:
    """A JSON value as a hashable key (lists and objects are not hashable)."""
    if not isinstance(value, (dict, list)):
        return repr(value)
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):
        return repr(value)


def _json_text(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)[:200]
    except (ValueError, RecursionError) as exc:
        return f"(not shown: {type(exc).__name__})"


def _rows(counted: int, exact: bool, bytes_seen: int, size: int) -> tuple[int, bool]:
    if exact or bytes_seen >= size:
        return counted, exact
    return round(counted * size / max(1, bytes_seen)), False


def _row_text(row: list[str], delimiter: str) -> str:
    if len(row) == 1:
        return _shown(row[0], 300)
    buf = io.StringIO()  # csv quoting keeps "Adult, 1 Egg Stage" one cell
    csv.writer(buf, delimiter=delimiter, lineterminator="").writerow(
        [_shown(c, 40) for c in row[:100]]
    )
    return buf.getvalue()


# control characters shown escaped: a line break (a quoted multi-line field) or a NUL inside a
# value must not break the profile's one-line-per-item layout
_ESCAPES = {i: f"\\x{i:02x}" for i in (*range(32), 0x7F) if i != 9} | {10: "\\n", 13: "\\r"}


def _shown(value: str, limit: int) -> str:
    """`value` for the profile text: on one line, at most `limit` characters of it."""
    cut = value if len(value) <= limit else value[: limit - 1] + "…"
    return cut.translate(_ESCAPES)


def _control_ratio(text: str) -> float:
    if not text:
        return 0.0
    bad = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f\v\x1b")
    return bad / len(text)


def _num(x: float | None) -> str:
    if x is None:
        return "?"
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:.6g}"


def human_size(n: int) -> str:
    size: float = n  # an int while it is still bytes
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _rows_text(p: Profile) -> str:
    """How many rows (lines, records), and how sure: "12 rows", "~3,400 rows (estimated)"."""
    unit = {"text": "lines", "jsonl": "records", "json": "records"}.get(p.kind, "rows")
    if p.rows == 1:
        unit = unit[:-1]
    if p.rows_exact:
        return f"{p.rows:,} {unit}"
    if p.rows_at_least:
        return f"at least {p.rows:,} {unit}"
    return f"~{p.rows:,} {unit} (estimated)"


def glance(p: Profile) -> str:
    """The profile's shape in one line, for a person: "60 rows × 3 columns, 0 missing"."""
    if p.rows is None or p.error:
        return f"{p.kind}, {human_size(p.size)}"
    if not p.columns:
        return f"{p.kind}, {_rows_text(p)}"
    width = p.column_count or len(p.columns)
    line = f"{_rows_text(p)} × {width:,} column" + ("" if width == 1 else "s")
    nulls = [c.nulls for c in p.columns if c.nulls is not None]
    if len(nulls) < len(p.columns):
        return line + ", missing values not counted"
    counted_in_part = width > len(p.columns) or any(c.nulls_note for c in p.columns)
    return line + f", {'at least ' if counted_in_part else ''}{sum(nulls):,} missing"


def render(p: Profile, caps: Caps = DEFAULT_CAPS) -> str:
    when = (
        dt.datetime.fromtimestamp(p.mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        if p.mtime is not None
        else "unknown"
    )
    head = f"{p.name}: {p.kind}, {human_size(p.size)}"
    if caps.identity:
        head += f", modified {when}"
    if p.sha256 and caps.identity:
        head += f", sha256 {p.sha256[:16]}…"
    lines = [head]
    shape = []
    width = p.column_count or len(p.columns)
    if p.encoding:
        shape.append(f"encoding {p.encoding}")
    if p.delimiter:
        shape.append(f"delimiter {json.dumps(p.delimiter)}")
    if p.header is not None and p.kind in ("csv", "tsv"):
        shape.append("header row: yes" if p.header else "header row: none found (use header=None)")
    if p.rows is not None:
        shape.append(_rows_text(p) + (f" x {width} columns" if p.columns else ""))
    if shape:
        lines.append(", ".join(shape))
    lines += p.extra
    if p.columns:
        lines.append("columns (name: type, nulls):")
        for c in p.columns[: caps.max_columns]:
            nulls = (
                "? nulls"
                if c.nulls is None
                else f"{c.nulls:,} null" + ("" if c.nulls == 1 else "s")
            )
            where = f" {c.nulls_note}" if c.nulls_note and c.nulls is not None else ""
            detail = f"; {_shown(c.detail, 200)}" if c.detail else ""
            lines.append(f"  {_shown(c.name, 80)}: {_shown(c.type, 80)}, {nulls}{where}{detail}")
        if width > caps.max_columns:
            lines.append(f"  ... {width - caps.max_columns} more columns")
    if p.sample:
        lines.append(
            "first rows:" if p.kind in ("csv", "tsv", "parquet", "xlsx") else "first lines:"
        )
        lines += ["  " + _row_text(row, p.delimiter or ",")[:300] for row in p.sample]
    lines += [f"note: {n}" for n in p.notes]
    text = "\n".join(lines)
    if len(text) > caps.max_chars:
        text = text[: caps.max_chars - 40].rsplit("\n", 1)[0] + "\n... (profile cut to fit)"
    return text
