"""Text side of profiling: encoding detection and delimited tables (CSV, TSV, ...).

Works on bytes already read (a prefix or the whole file), so it is the same for host inputs
and workspace files. Null tokens and number syntax follow pandas' `read_csv` defaults, so
what the model is told matches what `pd.read_csv` will give it.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import io
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import charset_normalizer

# pandas.read_csv's default na_values, plus the empty field
NA_TOKENS = frozenset(
    {
        "",
        "#N/A",
        "#N/A N/A",
        "#NA",
        "-1.#IND",
        "-1.#QNAN",
        "-NaN",
        "-nan",
        "1.#IND",
        "1.#QNAN",
        "<NA>",
        "N/A",
        "NA",
        "NULL",
        "NaN",
        "None",
        "n/a",
        "nan",
        "null",
    }
)
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(
    r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|Infinity)", re.IGNORECASE
)
_BOOL = frozenset({"True", "False", "TRUE", "FALSE", "true", "false"})
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?")
DELIMITERS = (",", "\t", ";", "|")
FIELD_LIMIT = 1 << 26  # characters in one field while a table is parsed (csv's own: 131,072)
MAX_COLUMNS = 2000  # columns given stats; a wider table is counted, its other columns not read
# distinct values held for all the columns of one table together (each column has its own cap
# too, `distinct` of parse_table): a wide table of unique values must not fill the memory
DISTINCT_BUDGET = 2_000_000
_WESTERN = ("cp1252", "latin_1", "iso8859_15")


@dataclass
class Encoding:
    codec: str  # what Python (and pandas' `encoding=`) should use
    label: str  # what the model is told
    errors: str = "strict"  # "replace" when the bytes are mixed
    note: str = ""


def detect_encoding(data: bytes, complete: bool) -> Encoding | None:
    """The encoding of a text file, or None when the bytes are not text."""
    for bom, codec, label in (
        (codecs.BOM_UTF8, "utf-8-sig", "utf-8 with BOM"),
        (codecs.BOM_UTF32_LE, "utf-32", "utf-32 (little-endian, BOM)"),
        (codecs.BOM_UTF32_BE, "utf-32", "utf-32 (big-endian, BOM)"),
        (codecs.BOM_UTF16_LE, "utf-16", "utf-16 (little-endian, BOM)"),
        (codecs.BOM_UTF16_BE, "utf-16", "utf-16 (big-endian, BOM)"),
    ):
        if data.startswith(bom):
            return Encoding(codec, label)
    sample = data[:65536]
    half = max(1, len(sample) // 2)
    even_nul, odd_nul = sample[0::2].count(0), sample[1::2].count(0)
    # ASCII-heavy UTF-16 without a BOM: a zero byte in every other position
    if len(sample) >= 4 and odd_nul > 0.4 * half and even_nul < 0.05 * half:
        return Encoding("utf-16-le", "utf-16 (little-endian, no BOM)")
    if len(sample) >= 4 and even_nul > 0.4 * half and odd_nul < 0.05 * half:
        return Encoding("utf-16-be", "utf-16 (big-endian, no BOM)")
    if b"\x00" in sample:
        return None
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=complete)
    except UnicodeDecodeError as exc:
        return _not_utf8(data, exc)
    return Encoding("utf-8", "utf-8 (ASCII only)" if sample.isascii() else "utf-8")


def _not_utf8(data: bytes, exc: UnicodeDecodeError) -> Encoding:
    text = data[: 1 << 20].decode("utf-8", "replace")
    bad = text.count("\ufffd")
    good = sum(1 for ch in text if ord(ch) > 127 and ch != "\ufffd")
    if good >= 3 and good >= bad:  # real UTF-8 text with a few broken bytes: mixed encodings
        return Encoding(
            "utf-8",
            "mixed: mostly utf-8",
            "replace",
            f"{bad} invalid utf-8 sequence(s), first at byte {exc.start}; read it with "
            "encoding='utf-8', encoding_errors='replace'",
        )
    matches = list(charset_normalizer.from_bytes(data[:32768]))
    if not matches:
        return Encoding("latin-1", "latin-1 (guessed)", note="no encoding fitted well")
    best = matches[0]
    for m in matches:  # equal fit: prefer the Western code page people actually use
        if m.chaos <= best.chaos + 0.01 and {m.encoding, *m.could_be_from_charset} & set(_WESTERN):
            return Encoding("cp1252", "cp1252 (latin-1 compatible)")
    codec = best.encoding
    label = {"gb18030": "gbk/gb18030", "gb2312": "gbk/gb18030", "gbk": "gbk/gb18030"}.get(
        codec, codec
    )
    return Encoding("gb18030" if label == "gbk/gb18030" else codec, label)


def decode(data: bytes, enc: Encoding, complete: bool, errors: str | None = None) -> str:
    """Decode a prefix; a prefix loses its last, probably partial, line. Line endings come
    back as LF whatever the file used (CR, LF, CRLF or a mix), as everything after this
    expects. `errors` overrides the encoding's own ("replace" for a second try)."""
    text = codecs.getincrementaldecoder(enc.codec)(
        errors=errors or ("replace" if enc.errors == "replace" else "strict")
    ).decode(data, final=complete)
    text = normalize_newlines(text)
    if not complete and "\n" in text:
        text = text[: text.rindex("\n") + 1]
    return text


def normalize_newlines(text: str) -> str:
    """CRLF and bare CR (old spreadsheet exports, classic Mac OS) as LF. The csv module
    reads lines split at LF only: a CR left in one ends the record in the middle of the
    line, which is `csv.Error: new-line character seen in unquoted field`. pandas, like
    this, takes any of the three as a line end (a CR inside a quoted field becomes LF)."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


@dataclass
class ColumnStats:
    name: str
    kind: str = "empty"  # empty < bool | int < float < date < datetime < string
    nulls: int = 0
    minimum: float | None = None
    maximum: float | None = None
    examples: list[str] = field(default_factory=list)
    values: set[str] | None = None  # the distinct non-null values, when they are counted
    distinct_more: bool = False  # more distinct values than were held: `values` is a floor

    def add(self, value: str) -> None:
        if value in NA_TOKENS:
            self.nulls += 1
            return
        if len(self.examples) < 3 and value not in self.examples:
            self.examples.append(value[:40])
        self.kind = _widen(self.kind, value)
        if self.kind in ("int", "float"):
            x = float(value)
            self.minimum = x if self.minimum is None else min(self.minimum, x)
            self.maximum = x if self.maximum is None else max(self.maximum, x)


def _widen(kind: str, value: str) -> str:
    if kind == "string":
        return kind
    if kind in ("empty", "int") and _INT.fullmatch(value):
        return "int"
    if kind in ("empty", "int", "float") and _FLOAT.fullmatch(value):
        return "float"
    if kind in ("empty", "bool") and value in _BOOL:
        return "bool"
    if kind in ("empty", "date") and _DATE.fullmatch(value):
        return "date"
    if kind in ("empty", "date", "datetime") and _DATETIME.fullmatch(value):
        return "datetime"
    return "string"


@dataclass
class Table:
    delimiter: str
    header: bool
    columns: list[ColumnStats]  # the first MAX_COLUMNS of them
    rows: int  # data rows parsed (blank lines skipped, like pandas)
    complete: bool  # every row of the file was parsed
    sample: list[list[str]]
    ragged: int = 0
    first_ragged: str = ""
    stopped: str = ""  # why parsing stopped early, if it did
    chars_parsed: int = 0
    unclosed_quote: int = 0  # the line where a quoted field opens and never closes
    width: int = 0  # fields in the first row: all the columns, even past MAX_COLUMNS
    distinct: int = 0  # distinct values held per column (and rows for duplicates); 0: not counted
    duplicate_rows: int | None = None  # rows equal to an earlier row (None: not counted)
    duplicates_more: bool = False  # rows past the cap were not held: the count is a floor
    _rows_seen: set[int] = field(default_factory=set, repr=False)
    _budget: int = DISTINCT_BUDGET


def _count_distinct(table: Table, row: list[str]) -> None:
    """Distinct values per column and duplicate rows, each held up to `table.distinct`: past
    it a new value is not kept (the count says "at least"). Nulls are not values (pandas'
    nunique) and compare equal in rows (pandas' duplicated)."""
    cap = table.distinct
    for col, value in zip(table.columns, row, strict=False):
        if value in NA_TOKENS or col.values is None or value in col.values:
            continue
        if len(col.values) < cap and table._budget > 0:
            col.values.add(value)
            table._budget -= 1
        else:
            col.distinct_more = True
    key = hash(tuple(None if v in NA_TOKENS else v for v in row))
    if key in table._rows_seen:
        table.duplicate_rows = (table.duplicate_rows or 0) + 1
    elif len(table._rows_seen) < cap:
        table._rows_seen.add(key)
    else:
        table.duplicates_more = True


def sniff_delimiter(text: str) -> tuple[str, int]:
    """The delimiter that splits the first lines into the most consistent field counts."""
    lines = normalize_newlines(text[:65536]).split("\n")[:40]
    if len(lines) > 1 and not lines[-1]:
        lines = lines[:-1]
    best, best_score = ",", (0.0, 1)
    for d in DELIMITERS:
        counts = _field_counts(lines, d)
        if not counts:
            continue
        mode = max(set(counts), key=counts.count)
        score = (counts.count(mode) / len(counts), mode)
        if mode > 1 and score > best_score:
            best, best_score = d, score
    return best, best_score[1]


def _field_counts(lines: list[str], delimiter: str) -> list[int]:
    """Fields per record of `lines` (no line ends in them); a record csv cannot read (a field
    over its size limit) ends the count: the sniffer decides on what came before it."""
    counts: list[int] = []
    try:
        for row in csv.reader(lines, delimiter=delimiter):
            if row:
                counts.append(len(row))
    except csv.Error:
        pass
    return counts


def _looks_like_header(first: list[str]) -> bool:
    """Names, not data: no numbers, no blanks, no repeats."""
    if any(_FLOAT.fullmatch(c.strip()) or c.strip() in NA_TOKENS for c in first[:MAX_COLUMNS]):
        return False
    return len(set(first)) == len(first)


def parse_table(
    text: str, delimiter: str, deadline: float, complete: bool, distinct: int = 0
) -> Table:
    """Column stats of delimited `text` (as `decode` gives it: LF line ends; any others are
    made LF here too, so `chars_parsed` counts in the normalised text). `distinct` > 0 also
    counts each column's distinct values and the duplicate rows, holding at most that many."""
    text = normalize_newlines(text)
    reader = csv.reader(io.StringIO(text, newline="\n"), delimiter=delimiter)
    table = Table(delimiter, True, [], 0, complete, [], distinct=distinct)
    if distinct:
        table.duplicate_rows = 0
    first: list[str] | None = None
    width = 0
    cells_to_check = 0  # the clock is read every 20,000 fields: wide rows count by their width
    last_start = last_end = 0  # physical lines before and after the latest record
    with _wide_fields():
        try:
            for lineno, row in enumerate(reader, 1):
                last_start, last_end = last_end, reader.line_num
                if not row:
                    continue  # blank line: pandas skips it
                if first is None:
                    first = row
                    table.header = _looks_like_header(row)
                    width = table.width = len(row)
                    shown = min(width, MAX_COLUMNS)
                    names = (
                        row[:shown] if table.header else [f"column_{i + 1}" for i in range(shown)]
                    )
                    table.columns = [
                        ColumnStats(n.strip() or f"unnamed_{i}", values=set() if distinct else None)
                        for i, n in enumerate(names)
                    ]
                    if table.header:
                        continue
                _add_row(table, row, width, lineno)
                cells_to_check -= len(row) + 1
                if cells_to_check <= 0:
                    cells_to_check = 20_000
                    if time.monotonic() > deadline:
                        table.stopped = f"time cap reached after {table.rows:,} rows"
                        table.complete = False
                        break
        except csv.Error as exc:  # a field over FIELD_LIMIT
            table.stopped = f"CSV parsing stopped at line {reader.line_num:,}: {exc}"
            table.complete = False
        if complete and not table.stopped and first is not None:
            table.unclosed_quote = _unclosed_quote(text, delimiter, last_start, last_end)
    table.chars_parsed = _chars_upto_line(text, reader.line_num) if table.stopped else len(text)
    return table


def _unclosed_quote(text: str, delimiter: str, start: int, end: int) -> int:
    """The line where the last record (physical lines start+1..end) starts, if the file ends
    inside one of its quoted fields (csv reads that as a field running to the end; pandas
    fails: "EOF inside string"), else 0. Only that record is read again, in strict mode."""
    pos = len(text) - 1 if text.endswith("\n") else len(text)
    for _ in range(end - start):  # back to the line break before the record
        pos = text.rfind("\n", 0, pos)
        if pos < 0:
            break
    tail = io.StringIO(text[pos + 1 :], newline="\n")
    try:
        for _ in csv.reader(tail, delimiter=delimiter, strict=True):
            pass
    except csv.Error as exc:
        return start + 1 if "unexpected end of data" in str(exc) else 0
    return 0


_limit_lock = threading.Lock()
_limit_users = 0
_limit_saved = 0


@contextlib.contextmanager
def _wide_fields() -> Iterator[None]:
    """csv's field size limit (process-wide, 131,072 characters by default) raised to
    FIELD_LIMIT while tables are parsed: one long cell, which pandas reads, is no reason to
    stop. Parses may overlap in threads; the last one to finish puts the old limit back."""
    global _limit_users, _limit_saved
    with _limit_lock:
        if _limit_users == 0:
            _limit_saved = csv.field_size_limit()
            csv.field_size_limit(max(_limit_saved, FIELD_LIMIT))
        _limit_users += 1
    try:
        yield
    finally:
        with _limit_lock:
            _limit_users -= 1
            if _limit_users == 0:
                csv.field_size_limit(_limit_saved)


def _add_row(table: Table, row: list[str], width: int, lineno: int) -> None:
    table.rows += 1
    if len(row) != width:
        table.ragged += 1
        if not table.first_ragged:
            table.first_ragged = f"line {lineno} has {len(row)} fields, the header has {width}"
    if len(table.sample) < 3:
        table.sample.append(row[:MAX_COLUMNS])
    for col, value in zip(table.columns, row, strict=False):  # ragged rows are expected
        col.add(value)
    for col in table.columns[len(row) :]:
        col.nulls += 1  # a short row: pandas fills the missing fields with NaN
    if table.distinct:
        _count_distinct(table, row)


def _chars_upto_line(text: str, line: int) -> int:
    pos = 0
    for _ in range(line):
        nxt = text.find("\n", pos)
        if nxt < 0:
            return len(text)
        pos = nxt + 1
    return pos
