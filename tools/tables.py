"""Text side of profiling: encoding detection and delimited tables (CSV, TSV, ...).

Works on bytes already read (a prefix or the whole file), so it is the same for host inputs
and workspace files. Null tokens and number syntax follow pandas' `read_csv` defaults, so
what the model is told matches what `pd.read_csv` will give it.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
import time
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


def decode(data: bytes, enc: Encoding, complete: bool) -> str:
    """Decode a prefix; a prefix loses its last, probably partial, line."""
    text = codecs.getincrementaldecoder(enc.codec)(
        errors="replace" if enc.errors == "replace" else "strict"
    ).decode(data, final=complete)
    if not complete and "\n" in text:
        text = text[: text.rindex("\n") + 1]
    return text.replace("\r\n", "\n")


@dataclass
class ColumnStats:
    name: str
    kind: str = "empty"  # empty < bool | int < float < date < datetime < string
    nulls: int = 0
    minimum: float | None = None
    maximum: float | None = None
    examples: list[str] = field(default_factory=list)

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
    columns: list[ColumnStats]
    rows: int  # data rows parsed (blank lines skipped, like pandas)
    complete: bool  # every row of the file was parsed
    sample: list[list[str]]
    ragged: int = 0
    first_ragged: str = ""
    stopped: str = ""  # why parsing stopped early, if it did
    chars_parsed: int = 0


def sniff_delimiter(text: str) -> tuple[str, int]:
    """The delimiter that splits the first lines into the most consistent field counts."""
    lines = text[:65536].split("\n")[:40]
    if len(lines) > 1 and not lines[-1]:
        lines = lines[:-1]
    best, best_score = ",", (0.0, 1)
    for d in DELIMITERS:
        counts = [len(r) for r in csv.reader(lines, delimiter=d) if r]
        if not counts:
            continue
        mode = max(set(counts), key=counts.count)
        score = (counts.count(mode) / len(counts), mode)
        if mode > 1 and score > best_score:
            best, best_score = d, score
    return best, best_score[1]


def _looks_like_header(first: list[str]) -> bool:
    """Names, not data: no numbers, no blanks, no repeats."""
    if any(_FLOAT.fullmatch(c.strip()) or c.strip() in NA_TOKENS for c in first):
        return False
    return len(set(first)) == len(first)


def parse_table(text: str, delimiter: str, deadline: float, complete: bool) -> Table:
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    table = Table(delimiter, True, [], 0, complete, [])
    first: list[str] | None = None
    width = 0
    try:
        for lineno, row in enumerate(reader, 1):
            if not row:
                continue  # blank line: pandas skips it
            if first is None:
                first = row
                table.header = _looks_like_header(row)
                width = len(row)
                names = row if table.header else [f"column_{i + 1}" for i in range(width)]
                table.columns = [
                    ColumnStats(n.strip() or f"unnamed_{i}") for i, n in enumerate(names)
                ]
                if table.header:
                    continue
            _add_row(table, row, width, lineno)
            if table.rows % 2000 == 0 and time.monotonic() > deadline:
                table.stopped = f"time cap reached after {table.rows:,} rows"
                table.complete = False
                break
    except csv.Error as exc:  # e.g. a field over csv's size limit, or a stray NUL
        table.stopped = f"CSV parsing stopped at line {reader.line_num}: {exc}"
        table.complete = False
    table.chars_parsed = _chars_upto_line(text, reader.line_num) if table.stopped else len(text)
    return table


def _add_row(table: Table, row: list[str], width: int, lineno: int) -> None:
    table.rows += 1
    if len(row) != width:
        table.ragged += 1
        if not table.first_ragged:
            table.first_ragged = f"line {lineno} has {len(row)} fields, the header has {width}"
    if len(table.sample) < 3:
        table.sample.append(row)
    for col, value in zip(table.columns, row, strict=False):  # ragged rows are expected
        col.add(value)
    for col in table.columns[len(row) :]:
        col.nulls += 1  # a short row: pandas fills the missing fields with NaN


def _chars_upto_line(text: str, line: int) -> int:
    pos = 0
    for _ in range(line):
        nxt = text.find("\n", pos)
        if nxt < 0:
            return len(text)
        pos = nxt + 1
    return pos
