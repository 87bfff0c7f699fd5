"""Profiles of real CSVs (palmerpenguins, vega_datasets) checked against pandas, and of messy
files: empty, ragged, gbk, utf-16, latin-1, mixed encodings, binary posing as CSV, parquet,
xlsx, JSON, and files over the size cap whose row counts are estimated and marked."""

import os
import time
from pathlib import Path

import palmerpenguins
import pandas as pd
import pytest
import vega_datasets
from click.testing import CliRunner

from sandcell.agent.cli import main
from sandcell.tools import Caps, file_metadata, file_metadata_tool, profile_inputs
from sandcell.tools import profile as profile_module
from sandcell.tools.profile import build_profile, glance, render
from sandcell.tools.tables import sniff_delimiter

PENGUINS = Path(palmerpenguins.__file__).parent / "data"
VEGA = Path(vega_datasets.__file__).parent / "_data"
REAL_CSVS = [
    PENGUINS / "penguins.csv",
    PENGUINS / "penguins-raw.csv",
    VEGA / "airports.csv",
    VEGA / "seattle-weather.csv",
    VEGA / "la-riots.csv",
    VEGA / "stocks.csv",
    VEGA / "us-employment.csv",
    VEGA / "iowa-electricity.csv",
    VEGA / "sf-temps.csv",
]


def _profile_file(path: Path, caps: Caps | None = None):
    obs = file_metadata_tool({path.name: path}, caps=caps or Caps()).function(
        path=f"/data/{path.name}"
    )
    assert obs.ok, obs.text
    return obs.data, obs.text


def _pandas_kind(dtype, has_nulls: bool) -> set[str]:
    """The profile types that agree with a pandas dtype."""
    if pd.api.types.is_bool_dtype(dtype):
        return {"bool"}
    if pd.api.types.is_integer_dtype(dtype):
        return {"int"}
    if pd.api.types.is_float_dtype(dtype):
        return {"float", "int"} if has_nulls else {"float"}  # ints with NaN become float64
    return {"string", "date", "datetime", "bool"}  # pandas leaves dates as text by default


@pytest.mark.parametrize("path", REAL_CSVS, ids=lambda p: p.name)
def test_real_csvs_match_pandas(path):
    profile, text = _profile_file(path)
    df = pd.read_csv(path)
    assert profile.kind == "csv" and profile.delimiter == "," and profile.header
    assert profile.rows == len(df) and profile.rows_exact
    assert [c.name for c in profile.columns] == list(df.columns)
    for col in profile.columns:
        nulls = int(df[col.name].isna().sum())
        assert col.nulls == nulls, (col.name, col.nulls, nulls)
        assert col.type in _pandas_kind(df[col.name].dtype, nulls > 0), (
            col.name,
            col.type,
            df[col.name].dtype,
        )
    assert profile.sample[0] == [
        str(v) for v in pd.read_csv(path, dtype=str, keep_default_na=False).iloc[0]
    ]
    assert f"{len(df):,} rows x {len(df.columns)} columns" in text
    assert len(profile.sha256) == 64 and len(text) <= Caps().max_chars


def test_estimated_row_count_is_marked_and_close(tmp_path):
    big = tmp_path / "airports_x20.csv"
    lines = (VEGA / "airports.csv").read_text().splitlines(keepends=True)
    big.write_text(lines[0] + "".join(lines[1:]) * 20)
    truth = (len(lines) - 1) * 20
    profile, text = _profile_file(big, Caps(head_bytes=256 << 10, full_bytes=1 << 20))
    assert not profile.rows_exact and "(estimated)" in text and "~" in text
    assert abs(profile.rows - truth) / truth < 0.05, (profile.rows, truth)
    assert profile.sha256 is None and "sha256 not computed" in text
    assert "in the first" in text  # null counts say they come from a sample


def test_time_cap_turns_exact_counts_into_estimates(tmp_path):
    big = tmp_path / "many.csv"
    big.write_text("a,b,c\n" + "1,2.5,x\n" * 300_000)
    start = time.perf_counter()
    profile, text = _profile_file(big, Caps(time_s=0.05))
    assert time.perf_counter() - start < 3
    assert not profile.rows_exact and "time cap reached" in text
    assert abs(profile.rows - 300_000) / 300_000 < 0.05


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_empty_file(tmp_path):
    profile, text = _profile_file(_write(tmp_path, "empty.csv", b""))
    assert profile.kind == "empty" and profile.rows == 0 and "the file is empty" in text


def test_header_only(tmp_path):
    profile, _ = _profile_file(_write(tmp_path, "h.csv", b"a,b,c\n"))
    assert profile.rows == 0 and [c.name for c in profile.columns] == ["a", "b", "c"]


def test_ragged_rows(tmp_path):
    path = _write(tmp_path, "ragged.csv", b"a,b,c\n1,2,3\n4,5\n6,7,8,9\n10,11,12\n")
    profile, text = _profile_file(path)
    assert profile.rows == 4 and "ragged: 2 row(s)" in text and "line 3 has 2 fields" in text
    assert profile.columns[2].nulls == 1  # the short row's missing field, as pandas would fill it


GBK_TEXT = (
    "城市,人口,面积\n北京,2189,16410.5\n上海,2487,6340.5\n广州,1868,7434.4\n深圳,1756,1997.5\n"
)


@pytest.mark.parametrize(
    "codec, label",
    [
        ("gbk", "gbk/gb18030"),
        ("utf-16", "utf-16 (little-endian, BOM)"),
        ("utf-16-le", "utf-16 (little-endian, no BOM)"),
        ("utf-8-sig", "utf-8 with BOM"),
        ("utf-8", "utf-8"),
    ],
)
def test_chinese_csv_encodings(tmp_path, codec, label):
    path = _write(tmp_path, "cities.csv", GBK_TEXT.encode(codec))
    profile, _ = _profile_file(path)
    assert profile.encoding == label, profile.encoding
    assert [c.name for c in profile.columns] == ["城市", "人口", "面积"]
    assert (
        profile.rows == 4
        and profile.columns[1].type == "int"
        and profile.columns[2].type == "float"
    )
    assert profile.sample[0] == ["北京", "2189", "16410.5"]


def test_latin1(tmp_path):
    rows = (
        "name,city,score\nJosé,Zürich,1.5\nFrançoise,Besançon,2\nMüller,Köln,3\nNaïve,Orléans,4\n"
    )
    profile, _ = _profile_file(_write(tmp_path, "people.csv", rows.encode("latin-1")))
    assert "latin-1" in profile.encoding
    assert profile.sample[0] == ["José", "Zürich", "1.5"] and profile.columns[2].type == "float"
    df = pd.read_csv(tmp_path / "people.csv", encoding="cp1252")  # the codec the profile names
    assert list(df["city"]) == ["Zürich", "Besançon", "Köln", "Orléans"]


def test_mixed_encodings(tmp_path):
    data = ("name,city\n" + "Zoë,Zürich\n" * 20).encode() + "Müller,Köln\n".encode("latin-1")
    profile, text = _profile_file(_write(tmp_path, "mixed.csv", data))
    assert profile.encoding == "mixed: mostly utf-8" and "invalid utf-8" in text
    assert "encoding_errors='replace'" in text and profile.rows == 21


def test_binary_posing_as_csv(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + os.urandom(5000)
    profile, text = _profile_file(_write(tmp_path, "data.csv", png))
    assert (
        profile.kind == "binary"
        and "PNG image" in text
        and "named .csv but the content is binary" in text
    )
    profile, text = _profile_file(_write(tmp_path, "noise.csv", os.urandom(20000)))
    assert profile.kind == "binary" and profile.columns == []


def test_tsv_semicolon_and_headerless(tmp_path):
    assert _profile_file(_write(tmp_path, "a.tsv", b"x\ty\n1\t2\n3\t4\n"))[0].kind == "tsv"
    p, _ = _profile_file(_write(tmp_path, "b.csv", b"x;y;z\n1,5;2;3\n4;5;6\n"))
    assert (
        p.delimiter == ";" and p.rows == 2 and p.columns[0].type == "string"
    )  # 1,5 is not a number here
    p, text = _profile_file(_write(tmp_path, "c.csv", b"1,2,3\n4,5,6\n"))
    assert (
        not p.header and p.rows == 2 and "header=None" in text and p.columns[0].name == "column_1"
    )


def test_quoted_fields_with_newlines_count_as_one_row(tmp_path):
    data = b'id,comment\n1,"line one\nline two"\n2,"a, b"\n3,plain\n'
    p, text = _profile_file(_write(tmp_path, "q.csv", data))
    assert p.rows == 3 == len(pd.read_csv(tmp_path / "q.csv")) and '"a, b"' in text


LINE_ENDINGS = {
    "cr": b"a,b\r1,2\r3,4\r",  # old spreadsheet exports (classic Mac OS)
    "lf": b"a,b\n1,2\n3,4\n",
    "crlf": b"a,b\r\n1,2\r\n3,4\r\n",
    "mixed": b"a,b\r\n1,2\r3,4\n",
    "cr-no-final-newline": b"a,b\r1,2\r3,4",
}


@pytest.mark.parametrize("data", LINE_ENDINGS.values(), ids=LINE_ENDINGS.keys())
def test_every_line_ending_gives_the_same_profile(tmp_path, data):
    path = _write(tmp_path, "cr.csv", data)
    profile, text = _profile_file(path)
    df = pd.read_csv(path)  # pandas reads all of these
    assert (len(df), list(df.columns)) == (2, ["a", "b"])
    assert profile.kind == "csv" and profile.delimiter == "," and profile.header
    assert profile.rows == 2 and profile.rows_exact and "2 rows x 2 columns" in text
    assert [c.name for c in profile.columns] == ["a", "b"]
    assert [c.type for c in profile.columns] == ["int", "int"]
    assert profile.sample == [["1", "2"], ["3", "4"]]


def test_cr_line_endings_inside_quotes_and_over_the_prefix(tmp_path):
    # a quoted field spanning a bare CR stays one row; a prefix cut of a CR file still parses
    p, _ = _profile_file(_write(tmp_path, "q.csv", b'id,note\r1,"x\ry"\r2,z\r'))
    assert p.rows == 2 == len(pd.read_csv(tmp_path / "q.csv"))
    big = _write(tmp_path, "big.csv", b"a,b\r" + b"1,2\r" * 50_000)
    p, text = _profile_file(big, Caps(head_bytes=16 << 10, full_bytes=64 << 10))
    assert p.kind == "csv" and [c.name for c in p.columns] == ["a", "b"]
    assert not p.rows_exact and abs(p.rows - 50_000) / 50_000 < 0.05 and "(estimated)" in text


def test_the_sniffer_takes_text_with_any_line_ending():
    assert sniff_delimiter("a;b\r1;2\r3;4\r") == (";", 2)
    assert sniff_delimiter("a\tb\r\n1\t2\r3\t4\n") == ("\t", 2)


def test_cr_csv_through_the_cli(tmp_path):
    path = _write(tmp_path, "cr.csv", LINE_ENDINGS["cr"])
    result = CliRunner().invoke(
        main, ["tool", "file_metadata", '{"path": "/data/cr.csv"}', "--input", str(path)]
    )
    assert result.exit_code == 0, result.output
    assert "/data/cr.csv: csv" in result.output and "2 rows x 2 columns" in result.output
    assert "  a: int" in result.output and "  b: int" in result.output


def test_json_and_jsonl(tmp_path):
    p, _ = _profile_file(VEGA / "cars.json")
    df = pd.read_json(VEGA / "cars.json")
    assert (
        p.kind == "json" and p.rows == len(df) and [c.name for c in p.columns] == list(df.columns)
    )
    assert {c.name: c.nulls for c in p.columns} == {c: int(df[c].isna().sum()) for c in df.columns}
    p, _ = _profile_file(
        _write(tmp_path, "e.jsonl", b'{"a": 1, "b": "x"}\n{"a": 2.5, "b": null}\n')
    )
    assert (
        p.kind == "jsonl"
        and p.rows == 2
        and p.columns[0].type == "float"
        and p.columns[1].nulls == 1
    )


def test_parquet_metadata(tmp_path):
    df = pd.read_csv(PENGUINS / "penguins.csv")
    path = tmp_path / "penguins.parquet"
    df.to_parquet(path, row_group_size=100)
    p, text = _profile_file(path)
    assert (
        p.kind == "parquet"
        and p.rows == len(df)
        and [c.name for c in p.columns] == list(df.columns)
    )
    assert {c.name: c.nulls for c in p.columns} == {c: int(df[c].isna().sum()) for c in df.columns}
    assert "4 row group(s)" in text and p.sample[0][0] == "Adelie"
    assert {c.name: c.type for c in p.columns}["bill_length_mm"] == "double"


def test_xlsx_via_openpyxl(tmp_path):
    df = pd.read_csv(PENGUINS / "penguins.csv")
    path = tmp_path / "penguins.xlsx"
    with pd.ExcelWriter(path) as writer:
        df.to_excel(writer, sheet_name="birds", index=False)
        df.head(5).to_excel(writer, sheet_name="small", index=False)
    p, text = _profile_file(path)
    assert (
        p.kind == "xlsx" and p.rows == len(df) and [c.name for c in p.columns] == list(df.columns)
    )
    assert {c.name: c.nulls for c in p.columns} == {c: int(df[c].isna().sum()) for c in df.columns}
    assert "sheets: birds (345 x 8), small (6 x 8)" in text


def test_corrupt_parquet_is_a_note_not_a_crash(tmp_path):
    p, text = _profile_file(_write(tmp_path, "bad.parquet", b"PAR1" + b"\x00" * 100 + b"junk"))
    assert p.kind == "parquet" and "could not read the parquet metadata" in text


def test_the_same_profile_from_bytes_and_from_the_file():
    path = PENGUINS / "penguins.csv"
    st = path.stat()
    from_bytes = build_profile(
        "/data/penguins.csv", st.st_size, st.st_mtime, path.read_bytes(), complete=True
    )
    assert render(from_bytes) == _profile_file(path)[1]


def test_profile_inputs_for_the_system_prompt(tmp_path):
    bad = _write(tmp_path, "bad.csv", os.urandom(3000))
    text = profile_inputs([PENGUINS / "penguins.csv", VEGA / "airports.csv", bad], max_chars=4000)
    assert text.startswith("Input files (read-only, under /data")
    assert (
        "/data/penguins.csv: csv" in text
        and "/data/airports.csv: csv" in text
        and "/data/bad.csv: binary" in text
    )
    assert len(text) <= 4000
    assert profile_inputs([]) == "There are no input files."
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    assert "FIFO" in profile_inputs([fifo])  # a refusal is reported, not raised


def test_an_input_that_cannot_be_profiled_is_one_line_and_the_others_still_are(
    tmp_path, monkeypatch
):
    good = _write(tmp_path, "good.csv", b"a,b\n1,2\n")
    cr = _write(tmp_path, "cr.csv", LINE_ENDINGS["cr"])
    broken = _write(tmp_path, "x.csv", b"a,b\n1,2\n")
    real = file_metadata.build_profile

    def failing(name, *args, **kwargs):
        if name == "/data/x.csv":
            raise OSError(5, "Input/output error\nwhile reading")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(file_metadata, "build_profile", failing)
    text = profile_inputs([good, broken, cr])
    lines = [ln for ln in text.splitlines() if "/data/x.csv" in ln]
    assert lines == [
        "/data/x.csv: could not be profiled (OSError: [Errno 5] Input/output error while reading)"
    ], text
    assert "/data/good.csv: csv" in text and "/data/cr.csv: csv" in text
    assert "1 row x 2 columns" in text and "2 rows x 2 columns" in text


def test_a_profiler_failure_is_an_honest_profile_not_a_crash(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the\nprofiler")

    monkeypatch.setattr(profile_module, "_table", broken)
    p = build_profile("/data/a.csv", 8, None, b"a,b\n1,2\n", complete=True)
    text = render(p)
    assert p.kind == "unknown" and p.error == "RuntimeError: a bug in the profiler"
    assert "could not be profiled (RuntimeError: a bug in the profiler)" in text
    # in the prompt: one line for that input, the text file (no table parsing) still profiled
    text = profile_inputs(
        [_write(tmp_path, "a.csv", b"a,b\n1,2\n"), _write(tmp_path, "n.txt", b"hello\n")]
    )
    assert "/data/a.csv: could not be profiled (RuntimeError: a bug in the profiler)\n" in text
    assert "/data/n.txt: text" in text and "1 line" in text


def test_long_fields_are_read_and_a_quote_left_open_is_named(tmp_path):
    import csv

    limit = csv.field_size_limit()
    p, text = _profile_file(
        _write(tmp_path, "long.csv", b"a,b\n" + b"x" * (1 << 20) + b",1\n2,3\n")
    )
    assert p.rows == 2 and [c.type for c in p.columns] == ["string", "int"]  # as pandas reads it
    assert csv.field_size_limit() == limit  # raised only while a table is parsed
    data = b'a,b\n1,2\n3,"x\n4,5\n'
    with pytest.raises(pd.errors.ParserError, match="EOF inside string"):
        pd.read_csv(_write(tmp_path, "open.csv", data))
    p, text = _profile_file(tmp_path / "open.csv")
    assert "the last record (from line 3) has a quoted field that is never closed" in text
    p, text = _profile_file(_write(tmp_path, "closed.csv", b'a,b\n1,2\n3,"x\n4",5\n'))
    assert "never closed" not in text and p.rows == 2


def test_a_column_of_numbers_then_text_shows_examples_not_a_range(tmp_path):
    p, text = _profile_file(_write(tmp_path, "s.csv", b"a,b\n1,2\n3,x\n"))
    assert p.columns[1].type == "string" and "b: string, 0 nulls; e.g. 2 | x" in text


def test_a_glance_says_the_shape_in_one_line(tmp_path):
    """What the page's folded profile says before it is opened."""
    table = tmp_path / "t.csv"
    table.write_text("a,b,c\n1,2,\n3,,x\n4,5,y\n")
    assert glance(_profile_file(table)[0]) == "3 rows × 3 columns, 2 missing"
    one = tmp_path / "one.csv"
    one.write_text("a\n1\n")
    assert glance(_profile_file(one)[0]) == "1 row × 1 column, 0 missing"
    notes = tmp_path / "notes.txt"
    notes.write_text("just words\nno table\n")
    assert glance(_profile_file(notes)[0]).startswith("text, 2 lines")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 8)
    assert glance(_profile_file(blob)[0]) == "binary, 2.0 KiB"
    # a big table counted in part: estimated rows, missing values as a floor
    big = tmp_path / "big.csv"
    big.write_text("n,m\n" + "1,\n" * 200_000)
    seen = glance(_profile_file(big, Caps(head_bytes=4096, full_bytes=8192))[0])
    assert seen.startswith("~") and "(estimated) × 2 columns, at least " in seen, seen
