"""Binary side of profiling: magic numbers, Parquet (footer metadata via pyarrow) and xlsx
(openpyxl read-only, after a zip-bomb check)."""

from __future__ import annotations

import datetime as dt
import time
import zipfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:  # heavy: imported where a parquet file or a workbook shows up
    import pyarrow.parquet as pq
    from openpyxl.worksheet._read_only import ReadOnlyWorksheet

MAGIC: list[tuple[bytes, str]] = [
    (b"PAR1", "parquet"),
    (b"PK\x03\x04", "zip archive"),
    (b"\x89PNG\r\n\x1a\n", "PNG image"),
    (b"\xff\xd8\xff", "JPEG image"),
    (b"GIF8", "GIF image"),
    (b"%PDF", "PDF document"),
    (b"\x1f\x8b", "gzip archive"),
    (b"BZh", "bzip2 archive"),
    (b"\xfd7zXZ\x00", "xz archive"),
    (b"7z\xbc\xaf\x27\x1c", "7z archive"),
    (b"\x7fELF", "ELF executable"),
    (b"SQLite format 3\x00", "SQLite database"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "legacy Office file (xls/doc)"),
    (b"ARROW1", "Arrow IPC file"),
]
MAX_XLSX_XML = 64 << 20  # uncompressed bytes openpyxl may have to hold (shared strings etc.)
MAX_ZIP_RATIO = 200  # a member compressed more than this is treated as a zip bomb


def sniff_magic(head: bytes) -> str | None:
    return next((what for magic, what in MAGIC if head.startswith(magic)), None)


@dataclass
class Column:
    name: str
    type: str
    nulls: int | None = None  # None: unknown
    nulls_note: str = ""  # e.g. "in the first 1,000 rows"
    detail: str = ""  # range or examples
    distinct: int | None = None  # distinct non-null values (None: not counted)
    distinct_more: bool = False  # there were more than `distinct`: the count hit its cap


@dataclass
class TableInfo:
    rows: int | None
    rows_exact: bool
    columns: list[Column]
    sample: list[list[str]]
    extra: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duplicate_rows: int | None = None  # counted only when asked for (and possible)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return str(value)[:60]


def parquet_info(f: BinaryIO, size: int, sample_cap: int, distinct: int = 0) -> TableInfo:
    """Rows and column types from the footer; with `distinct` > 0 a file up to `sample_cap`
    bytes is also read whole for its distinct values and duplicate rows."""
    import pyarrow.parquet as pq  # heavy: only when a parquet file shows up

    pf = pq.ParquetFile(f)
    meta, schema = pf.metadata, pf.schema_arrow
    flat = meta.num_columns == len(schema)  # nested columns have several leaf chunks
    columns = []
    for i, fld in enumerate(schema):
        nulls: int | None = None
        if flat:
            counts: list[int] = []
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(i).statistics
                if stats is None or not stats.has_null_count:
                    break  # a row group without the count: the column's nulls are unknown
                counts.append(stats.null_count)
            else:
                nulls = sum(counts) if counts else None
        columns.append(
            Column(fld.name, str(fld.type), nulls, "" if nulls is not None else "unknown")
        )
    sample: list[list[str]] = []
    notes = []
    if meta.num_row_groups and meta.row_group(0).total_byte_size <= sample_cap:
        batch = next(pf.iter_batches(batch_size=3), None)
        if batch is not None:
            sample = [[_cell(v) for v in row.values()] for row in batch.to_pylist()[:3]]
    elif meta.num_row_groups:
        notes.append("sample rows skipped: the first row group is too large to read here")
    extra = [f"{meta.num_row_groups} row group(s), written by {meta.created_by or 'unknown'}"]
    info = TableInfo(meta.num_rows, True, columns, sample, extra, notes)
    unpacked = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    if distinct and flat and size <= sample_cap and unpacked <= 4 * sample_cap:
        _parquet_counts(pf, info, distinct)  # small enough to read whole, also uncompressed
    elif distinct:
        info.notes.append("distinct values and duplicate rows not counted: the file is too large")
    return info


def _parquet_counts(pf: pq.ParquetFile, info: TableInfo, cap: int) -> None:
    """Exact nulls, distinct values and duplicate rows of a parquet file read whole. A
    column type arrow cannot count or pandas cannot hash (nested lists) stays uncounted."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pf.read()
    for column, data in zip(info.columns, table.columns, strict=True):
        column.nulls, column.nulls_note = data.null_count, ""
        try:
            count = pc.count_distinct(data, mode="only_valid").as_py()
        except pa.ArrowNotImplementedError:
            continue
        column.distinct, column.distinct_more = min(count, cap), count > cap
    try:
        info.duplicate_rows = int(table.to_pandas().duplicated().sum())
    except TypeError:  # unhashable values (lists, dicts): not counted
        info.notes.append("duplicate rows not counted: some values are lists or maps")


def xlsx_info(
    f: BinaryIO, deadline: float, max_rows_scanned: int = 5000, distinct: int = 0
) -> TableInfo:
    with zipfile.ZipFile(f) as zf:
        for info in zf.infolist():
            if info.flag_bits & 0x1:  # zipfile would raise RuntimeError reading it
                raise ValueError(f"{info.filename} is encrypted: a password is needed")
            ratio = info.file_size / max(1, info.compress_size)
            if ratio > MAX_ZIP_RATIO and info.file_size > (1 << 20):
                raise ValueError(
                    f"{info.filename} expands {ratio:.0f}x: refused as a possible zip bomb"
                )
        held = sum(
            i.file_size for i in zf.infolist() if not i.filename.startswith("xl/worksheets/")
        )
        if held > MAX_XLSX_XML:
            raise ValueError(
                f"the workbook's shared parts are {held >> 20} MiB uncompressed; too large to "
                "profile here. Open it with pandas in the python tool."
            )
    f.seek(0)
    import openpyxl  # heavy: only when a workbook shows up

    wb = openpyxl.load_workbook(f, read_only=True, data_only=True)
    try:
        sheets = wb.worksheets
        listed = ", ".join(
            f"{ws.title} ({ws.max_row or '?'} x {ws.max_column or '?'})" for ws in sheets[:20]
        )
        more = f", ... {len(sheets) - 20} more" if len(sheets) > 20 else ""
        extra = [f"sheets: {listed}{more}"]
        if not sheets:
            return TableInfo(0, True, [], [], extra, ["the workbook has no worksheets"])
        return _first_sheet(sheets[0], deadline, max_rows_scanned, extra, distinct)
    finally:
        wb.close()


def _first_sheet(
    ws: ReadOnlyWorksheet, deadline: float, max_rows: int, extra: list[str], distinct: int = 0
) -> TableInfo:
    rows_iter = ws.iter_rows(values_only=True)
    header = next(rows_iter, None)
    if header is None:
        return TableInfo(0, True, [], [], extra, [f"sheet {ws.title} is empty"])
    names = [_cell(h) or f"column_{i + 1}" for i, h in enumerate(header)]
    kinds: list[set[str]] = [set() for _ in names]
    nulls = [0] * len(names)
    values: list[set] = [set() for _ in names]  # at most max_rows each: scanning is capped
    rows_seen: set[tuple] = set()
    duplicates = 0
    sample: list[list[str]] = []
    scanned, finished = 0, True
    for row in rows_iter:
        if scanned >= max_rows or time.monotonic() > deadline:
            finished = False
            break
        scanned += 1
        if len(sample) < 3:
            sample.append([_cell(v) for v in row])
        cells = tuple(None if v == "" else v for v in row[: len(names)])
        for i in range(len(names)):
            v = cells[i] if i < len(cells) else None
            if v is None:
                nulls[i] += 1
            else:
                kinds[i].add(_py_kind(v))
                if distinct:
                    values[i].add(v)
        if distinct:
            duplicates += cells in rows_seen
            rows_seen.add(cells)
    note = "" if finished else f"in the first {scanned:,} rows"
    columns = [Column(n, _merge(k), c, note) for n, k, c in zip(names, kinds, nulls, strict=True)]
    if distinct:
        for column, held in zip(columns, values, strict=True):
            column.distinct, column.distinct_more = min(len(held), distinct), len(held) > distinct
    dim_rows = (ws.max_row - 1) if ws.max_row else None
    rows, exact = (scanned, True) if finished else (dim_rows, False)
    notes = [] if finished else ["row count from the sheet's dimension record"]
    info = TableInfo(rows, exact, columns, sample, [f"profiled sheet: {ws.title}"] + extra, notes)
    info.duplicate_rows = duplicates if distinct else None
    return info


def _py_kind(v: object) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, dt.datetime):
        return "datetime"
    if isinstance(v, dt.date):
        return "date"
    return "string"


def _merge(kinds: set[str]) -> str:
    if not kinds:
        return "empty"
    if kinds <= {"int"}:
        return "int"
    if kinds <= {"int", "float"}:
        return "float"
    return kinds.pop() if len(kinds) == 1 else "mixed (" + ", ".join(sorted(kinds)) + ")"
