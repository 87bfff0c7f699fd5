"""The host's check of a chart's or a table's data (sandbox/rich_data.py) and the text a model
reads of a chart (sandbox/chart_text.py), without a sandbox: any cell can send these MIME
types, so what is not the schema, or is too big, is dropped with a note and never parsed
past the cap."""

import json

import pytest

from sandcell.sandbox import boundary
from sandcell.sandbox.chart_text import chart_text
from sandcell.sandbox.rich_data import taken

pytestmark = pytest.mark.timeout(30)

LINE = {
    "type": "line", "title": "Sales", "x_label": "Month", "y_label": "Revenue (USD)",
    "x_unit": None, "y_unit": "USD", "x_ticks": [1.0, 2.0], "x_tick_labels": ["1", "2"],
    "x_scale": "linear", "y_ticks": [], "y_tick_labels": [], "y_scale": "linear",
    "elements": [{"label": "north", "points": [[1, 4.5], [2, None]], "truncated": None}],
}  # fmt: skip
TABLE = {
    "shape": [50, 2],
    "columns": [{"name": "a", "dtype": "int64"}, {"name": "b", "dtype": "str"}],
    "index": {"name": None, "values": [0, 1]},
    "rows": [[0, "x"], [1, None]],
}


def data(chart=None, table=None) -> dict:
    found = {"text/plain": "<Figure>"}
    if chart is not None:
        found[boundary.CHART_MIME] = chart if isinstance(chart, str) else json.dumps(chart)
    if table is not None:
        found[boundary.TABLE_MIME] = table if isinstance(table, str) else json.dumps(table)
    return found


def test_a_chart_and_a_table_of_the_schema_are_kept_and_their_mime_types_removed():
    given = data(LINE, TABLE)
    chart, table, notes = taken(given)
    assert notes == [] and given == {"text/plain": "<Figure>"}
    assert chart["elements"][0]["points"] == [[1.0, 4.5], [2.0, None]]
    assert chart["title"] == "Sales" and chart["truncated"] is None
    assert table["rows"] == [[0, "x"], [1, None]] and table["shape"] == [50, 2]


@pytest.mark.parametrize(
    ("forged", "said"),
    [
        ("not json", "invalid json"),
        ({"type": "radar", "elements": []}, "does not match any of the expected tags"),
        ({**LINE, "elements": [{"label": "a", "points": [[1, 2, 3]]}]}, "elements.0.points.0"),
        ({**LINE, "extra": 1}, "extra inputs are not permitted"),
        ({**LINE, "title": "t" * (boundary.LABEL_CHARS + 1)}, "title"),
        (
            {"type": "superchart", "elements": [{"type": "superchart", "elements": []}]},
            "elements.0",
        ),
        ("[" * 50_000 + "]" * 50_000, "recursion"),
        ('{"type": "pie", "elements": [{"label": "a", "angle": NaN, "radius": 1}]}', "finite"),
        ('{"type": "pie", "elements": [{"label": "a", "angle": 1e400, "radius": 1}]}', "finite"),
        ({**LINE, "elements": [{"label": "a", "points": [], "truncated": {"kept": 3}}]}, "points"),
        ({"type": "x" * 30_000, "elements": []}, "input tag"),
    ],
    ids=["not-json", "unknown-type", "three-numbers-a-point", "extra-key", "long-title", "nested",
         "deep", "nan", "infinity", "half-truncated", "long-type"],
)  # fmt: skip
def test_a_chart_not_of_the_schema_is_dropped_with_a_note_that_says_where(forged, said):
    chart, _, notes = taken(data(forged))
    assert chart is None and len(notes) == 1 and notes[0].startswith("[a chart's data was dropped")
    assert said in notes[0].lower() and len(notes[0]) < 500, notes


def test_data_over_the_cap_is_dropped_unread_and_a_table_whose_rows_do_not_fit_its_columns():
    huge = "[" + "1.0," * 2_000_000 + "1]"
    chart, _, notes = taken(data(huge))
    assert chart is None and "8,000,003 bytes, over the 128 KiB" in notes[0], notes
    bad = {**TABLE, "rows": [[0, "x", "extra"], [1, None]]}
    _, table, notes = taken(data(table=bad))
    assert table is None and "a row is not as long as the columns" in notes[0], notes
    _, table, notes = taken({boundary.TABLE_MIME: {"shape": [1, 1]}})  # not text
    assert table is None and notes == ["[a table's data was dropped: not JSON text]"]


def bars(n: int) -> dict:
    return {
        "type": "bar", "title": "Sales by region", "x_label": "region", "y_label": "sales",
        "x_unit": None, "y_unit": None,
        "elements": [{"label": f"R{i}", "group": "Group 1", "value": 100.5 + i} for i in range(n)],
    }  # fmt: skip


def test_the_model_reads_each_bar_and_a_long_series_as_its_count_ranges_and_a_few_points():
    text = chart_text(bars(12))
    assert text.splitlines()[0] == '[bar chart "Sales by region"; x: region; y: sales]'
    assert "R0 100.5, R1 101.5" in text and "R11 111.5" in text
    points = [[i, i % 100] for i in range(0, 10_000, 5)]
    series = {"label": "load", "points": points, "truncated": {"points": 10_000, "kept": 2000}}
    line = {**LINE, "elements": [series], "y_unit": None, "y_label": None}
    text = chart_text(line)
    assert "load: 10,000 points, x 0 to 9995, y 0 to 95; some: (0, 0), (2495, 95)" in text, text
    assert len(text) < 300, len(text)
    pie = {"type": "pie", "elements": [{"label": "cats", "angle": 90, "radius": 1}]}
    assert chart_text(pie) == "[pie chart]\n  cats 25.0%"
    box = {"type": "box_and_whisker", "elements": [{
        "label": "s", "min": 1, "first_quartile": 2, "median": 3, "third_quartile": 4, "max": 5,
        "outliers": [40]}]}  # fmt: skip
    assert "s: min 1, first quartile 2, median 3, third quartile 4, max 5; 1 outliers" in (
        chart_text(box)
    )


def test_a_data_frame_s_rows_reach_the_page_as_data_and_a_refused_chart_as_a_note():
    from sandcell.agent.serve.stream import shown
    from sandcell.sandbox import Execution, Result, render

    frame = Result({"text/plain": "   a\n0  1", "text/html": "<table><tr><td>1</td></tr></table>"},
                   table=TABLE, is_main=True)  # fmt: skip
    forged = Result({"text/plain": "x"}, notes=["[a chart's data was dropped: not JSON text]"])
    ex = Execution(results=[frame, forged])
    page = shown(ex)
    assert (
        page["table_data"]
        == [
            TABLE,
        ]
        and len(page["tables"]) == 1
    )  # the page draws the data
    assert page["results"] == ["x\n[a chart's data was dropped: not JSON text]"]
    assert "[a chart's data was dropped: not JSON text]" in render(ex)
