"""Inputs never break a run (issue 11): the profiler answers with a bounded, honest profile on
any bytes. Property tests (hypothesis) over the entry the tool uses (build_profile + render,
whole files and prefixes) and the file_metadata tool over real files: arbitrary bytes, CSV-like
text with any mix of CR/LF/CRLF, quotes left open, NUL bytes, invalid UTF-8 in the middle;
explicit examples for the big shapes (a 1 MB line, 10,000 columns, deep JSON).

Every profile must come back without the last-resort guard of build_profile firing
(`Profile.error` stays None): the guard keeps a run alive, the fuzzing is there to find what
would have tripped it."""

import dataclasses
import io
import itertools
import zipfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sandcell.tools import Caps, file_metadata_tool
from sandcell.tools.profile import build_profile, render

# a test's own timeout mark, where it has one, wins over the module's
pytestmark = pytest.mark.timeout(60)

CAPS = Caps()
MARGIN = 50  # the "... (profile cut to fit)" line may follow a cut
NAMES = ["/data/f.csv", "/data/f.tsv", "/data/f.txt", "/data/f.json", "/data/f.jsonl", "/data/f"]
_counter = itertools.count()


def check_bytes(data: bytes, name: str = "/data/f.csv", caps: Caps = CAPS) -> list[str]:
    """Profile `data` as a whole file and as the prefix of one three times its size; both must
    give a bounded, non-empty text and no profiler error. Returns the rendered texts."""
    texts = []
    for complete, size in ((True, len(data)), (False, 3 * len(data) + 1)):
        p = build_profile(name, size, None, data, complete=complete, caps=caps)
        text = render(p, caps)
        assert p.error is None, (p.error, data[:200])
        assert text and len(text) <= caps.max_chars + MARGIN, len(text)
        assert text.startswith(f"{name}: ")
        texts.append(text)
    return texts


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def check_tool(folder, data: bytes, suffix: str = ".csv") -> str:
    """The file_metadata tool over a real file holding `data`."""
    path = folder / f"f{next(_counter)}{suffix}"
    path.write_bytes(data)
    try:
        obs = file_metadata_tool({path.name: path}).function(path=f"/data/{path.name}")
    finally:
        path.unlink()
    assert obs.ok and obs.data.error is None, obs.text
    assert obs.text and len(obs.text) <= CAPS.max_chars + MARGIN
    return obs.text


# -- strategies --------------------------------------------------------------------------
FIELD_CHARS = [*"abcxyz019 .-,;\t|\"'", "é", "中"]
field = st.text(st.sampled_from(FIELD_CHARS), max_size=8)
field_with_breaks = st.text(st.sampled_from([*FIELD_CHARS, "\x00", "\r", "\n"]), max_size=8)
ending = st.sampled_from(["\r", "\n", "\r\n"])


@st.composite
def csv_like(draw, quotes: bool = True, breaks: bool = True) -> tuple[str, str]:
    """(text with a random mix of line endings, the same text with LF ones). With `breaks`,
    fields hold CRs, LFs and NULs of their own (left as they are in the LF text). Without,
    the two texts differ only in their line endings and must give the same profile (a NUL
    could turn a tiny sample into UTF-16 in one and not the other)."""
    delim = draw(st.sampled_from([",", ";", "\t", "|"]))
    width = draw(st.integers(1, 6))
    if not quotes:
        cell = st.text(st.sampled_from(list("abc019 .-é")), max_size=6)
    else:
        cell = field_with_breaks if breaks else field
    rows = draw(st.lists(st.lists(cell, min_size=width, max_size=width), max_size=12))
    lines = [delim.join(r) for r in rows]
    ends: list[str] = []
    for ln in lines:
        e = draw(ending)
        if not ln and ends and ends[-1] == "\r" and e == "\n":
            e = "\r\n"  # CR, then LF for an empty line, is one CRLF: a single line end
        ends.append(e)
    final = draw(st.booleans())
    mixed = "".join(ln + e for ln, e in zip(lines, ends, strict=True))
    lf = "".join(ln + "\n" for ln in lines)
    if not final and lines:
        mixed, lf = mixed[: -len(ends[-1])], lf[:-1]
    return mixed, lf


@st.composite
def spliced(draw, base: bytes, junk: st.SearchStrategy[bytes]) -> bytes:
    at = draw(st.integers(0, len(base)))
    return base[:at] + draw(junk) + base[at:]


# -- cheap properties, many examples --------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=4096), name=st.sampled_from(NAMES))
@example(data=b"a,b\r1,2\r3,4\r", name="/data/f.csv")
@example(data=b'a,"b\r1,2\r', name="/data/f.csv")
@example(data=b"\xff\xfe" + b"a\x00,\x00b\x00\r\x00", name="/data/f.csv")  # utf-16, odd length
@example(data=b"\xfe\xff\x00a\x00,\x00b\x00\r\x001", name="/data/f.csv")
@example(data=b"\x00" * 2000 + b"a,b\n", name="/data/f.csv")
@example(data=b"a,b\n" * 300 + b"\x00" * 500, name="/data/f.csv")
@example(data=b"[" * 100_000, name="/data/f.json")
@example(data=b'{"a": [' * 50_000, name="/data/f.jsonl")
@example(data=b"[" + b"1" * 5000 + b"]", name="/data/f.json")  # over int's digit limit
@example(data=b'{"a":' + b"9" * 5000 + b"}\n" * 2, name="/data/f.jsonl")
@example(data=b"x,y\n\x81,\x8d\n\xe9t\xe9,\x90\n", name="/data/f.csv")  # not cp1252
def test_arbitrary_bytes(data, name):
    check_bytes(data, name)


@settings(max_examples=200, deadline=None)
@given(texts=csv_like(breaks=False))
def test_any_mix_of_line_endings_profiles_like_lf(texts):
    mixed, lf = texts
    a = build_profile("/data/t.csv", len(mixed.encode()), None, mixed.encode(), complete=True)
    b = build_profile("/data/t.csv", len(lf.encode()), None, lf.encode(), complete=True)
    assert a.error is None and b.error is None
    same = ("kind", "encoding", "delimiter", "header", "rows", "columns", "sample", "extra")
    assert {k: getattr(a, k) for k in same} == {k: getattr(b, k) for k in same}
    check_bytes(mixed.encode())


@settings(max_examples=200, deadline=None)
@given(texts=csv_like(quotes=False))
def test_unquoted_csv_rows_and_columns_are_counted_with_any_line_ending(texts):
    mixed, lf = texts
    p = build_profile("/data/t.csv", len(mixed.encode()), None, mixed.encode(), complete=True)
    assert p.error is None
    lines = [ln for ln in lf.split("\n") if ln]
    if p.kind in ("csv", "tsv") and lines:
        assert p.rows == len(lines) - (1 if p.header else 0)
        assert len(p.columns) == len(lines[0].split(p.delimiter))


@settings(max_examples=200, deadline=None)
@given(
    data=csv_like().flatmap(
        lambda t: spliced(t[0].encode(), st.sampled_from([b'"', b'"\r', b'\r"', b'x"y', b'""']))
    )
)
def test_quotes_left_open(data):
    check_bytes(data)


@settings(max_examples=200, deadline=None)
@given(
    data=csv_like().flatmap(
        lambda t: spliced(t[0].encode(), st.binary(max_size=4).map(lambda b: b"\x00" + b))
    )
)
def test_nul_bytes(data):
    check_bytes(data)


@settings(max_examples=200, deadline=None)
@given(
    data=csv_like().flatmap(
        lambda t: spliced(
            ("name,city\n" + "Zoë,Zürich\n" * 5).encode() + t[0].encode(),
            st.sampled_from([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]),
        )
    )
)
def test_invalid_utf8_in_the_middle(data):
    check_bytes(data)


@settings(max_examples=100, deadline=None)  # `folder` is module-scoped: shared, not reset
@given(data=st.one_of(st.binary(max_size=2048), csv_like().map(lambda t: t[0].encode())))
def test_the_tool_over_a_real_file(folder, data):
    check_tool(folder, data)


def _xlsx_bytes() -> bytes:
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["a", "b"])
    ws.append([1, "x"])
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


XLSX = _xlsx_bytes()


@settings(max_examples=100, deadline=None)
@given(at=st.integers(0, len(XLSX) - 1), junk=st.binary(min_size=1, max_size=16))
def test_corrupt_workbooks_and_parquet(at, junk):
    check_bytes(XLSX[:at] + junk + XLSX[at + len(junk) :], "/data/f.xlsx")
    check_bytes(b"PAR1" + junk + XLSX[at:] + b"PAR1", "/data/f.parquet")


def test_a_workbook_with_an_encrypted_member():
    # the flag bits of the theme's central directory entry (46 bytes before its name there):
    # openpyxl reads that part, and zipfile raises RuntimeError for an encrypted member
    at = XLSX.rindex(b"xl/theme/theme1.xml") - 46 + 8
    data = XLSX[:at] + bytes([XLSX[at] | 1]) + XLSX[at + 1 :]
    assert "is encrypted: a password is needed" in check_bytes(data, "/data/f.xlsx")[0]


def test_a_workbook_whose_parts_are_not_xml():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for member in zipfile.ZipFile(io.BytesIO(XLSX)).namelist():
            zf.writestr(member, b"<not xml")
    check_bytes(buf.getvalue(), "/data/f.xlsx")


# -- the big shapes, a few explicit examples ----------------------------------------------
MB = 1 << 20
BIG = {
    "one 1 MB line": b"a,b\n" + b"x" * MB + b",1\n2,3\n",
    "one 1 MB line, no newline": b"x," * (MB // 2),
    "a 1 MB quoted field left open": b'a,b\n1,"' + b"y" * MB + b"\n",
    "a 1 MB header cell": b"h" * MB + b",b\n1,2\n",
    "a 1 MB line of CRs": b"a,b\r" + b"\r" * MB,
    "10,000 columns": (
        ",".join(f"c{i}" for i in range(10_000)) + "\n" + ",".join("1" * 10_000) + "\n"
    ).encode(),
    "10,000 columns, CR": (
        ";".join(f"c{i}" for i in range(10_000)) + "\r" + (";".join(["2.5"] * 10_000) + "\r") * 20
    ).encode(),
    "10,000 columns, ragged": b",".join(b"%d" % i for i in range(10_000)) + b"\n1,2\n",
    "deep JSON": b"[" * 200_000 + b"]" * 200_000,
    "1 MB of NUL after text": b"a,b\n" * 1000 + b"\x00" * MB,
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("data", BIG.values(), ids=BIG.keys())
def test_big_shapes(folder, data):
    texts = check_bytes(data)
    # the same profile through the tool (but for the name and modification time on line one)
    assert check_tool(folder, data).split("\n")[1:] == texts[0].split("\n")[1:]
    # the prompt's smaller budget holds too
    small = dataclasses.replace(CAPS, max_chars=600, identity=False)
    check_bytes(data, caps=small)


def test_ten_thousand_columns_are_counted_and_listed_within_the_cap():
    from sandcell.tools.tables import MAX_COLUMNS

    data = BIG["10,000 columns, CR"]
    p = build_profile("/data/w.csv", len(data), None, data, complete=True)
    text = render(p)
    assert p.rows == 20 and p.column_count == 10_000 and "20 rows x 10000 columns" in text
    assert len(p.columns) == MAX_COLUMNS and p.columns[-1].type == "float"
    assert "only the first 2,000 were profiled" in text or "(profile cut to fit)" in text
