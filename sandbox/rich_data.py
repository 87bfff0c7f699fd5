"""The data behind a chart or a table a cell showed (boundary.CHART_MIME, boundary.TABLE_MIME),
checked before the host keeps it: the kernel's extension makes it, but any cell can display
these MIME types with whatever it likes. JSON text over DATA_BYTES is dropped unread; anything
else that is not the schema below (types, lengths, texts within the kernel's caps) is dropped
too, each with a note that says why. What is kept is plain JSON (dicts), for the trace, the
notebook, the API and the page."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from sandcell.sandbox.boundary import (
    CHART_AXES,
    CHART_ELEMENTS,
    CHART_MIME,
    CHART_OUTLIERS,
    CHART_POINTS,
    CHART_TICKS,
    DATA_BYTES,
    LABEL_CHARS,
    TABLE_COLUMNS,
    TABLE_MIME,
    TABLE_ROWS,
)

Text = Annotated[str, Field(max_length=LABEL_CHARS)]
Number = float | None  # None: NaN or infinite
Value = float | Text | None  # a number, an ISO date, a category
Count = Annotated[int, Field(ge=0)]
NOTE_CHARS = 200  # of a refusal's reason, which may quote what was sent


class Strict(BaseModel):
    # no NaN or Infinity: JSON has none (the API, the event stream and a notebook would break)
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, allow_inf_nan=False)


class PointsCut(Strict):
    """A series the kernel thinned: `points` it had, `kept` sent."""

    points: Count
    kept: Count


class ElementsCut(Strict):
    """A chart the kernel cut: `elements` (series, bars, wedges, boxes, axes) it had, `kept`."""

    elements: Count
    kept: Count


class Series(Strict):
    label: Text
    points: list[tuple[Value, Value]] = Field(max_length=CHART_POINTS)
    truncated: PointsCut | None = None


class Bar(Strict):
    label: Text
    group: Text
    value: Number


class Wedge(Strict):
    label: Text
    angle: float
    radius: Number


class Box(Strict):
    label: Text
    min: Number
    first_quartile: Number
    median: Number
    third_quartile: Number
    max: Number
    outliers: list[Number] = Field(max_length=CHART_OUTLIERS)


class Chart(Strict):
    type: str  # each kind of chart names its own (first in a dump, as the kernel sends it)
    title: Text | None = None
    truncated: ElementsCut | None = None


class Axes2D(Chart):
    x_label: Text | None = None
    y_label: Text | None = None
    x_unit: Text | None = None
    y_unit: Text | None = None


Ticks = Annotated[list[Value], Field(max_length=CHART_TICKS)]
TickLabels = Annotated[list[Text], Field(max_length=CHART_TICKS)]


class PointChart(Axes2D):
    x_ticks: Ticks = []
    x_tick_labels: TickLabels = []
    x_scale: Text = "linear"
    y_ticks: Ticks = []
    y_tick_labels: TickLabels = []
    y_scale: Text = "linear"


class LineChart(PointChart):
    type: Literal["line"]
    elements: list[Series] = Field(max_length=CHART_ELEMENTS)


class ScatterChart(PointChart):
    type: Literal["scatter"]
    elements: list[Series] = Field(max_length=CHART_ELEMENTS)


class BarChart(Axes2D):
    type: Literal["bar"]
    elements: list[Bar] = Field(max_length=CHART_ELEMENTS)


class PieChart(Chart):
    type: Literal["pie"]
    elements: list[Wedge] = Field(max_length=CHART_ELEMENTS)


class BoxChart(Axes2D):
    type: Literal["box_and_whisker"]
    elements: list[Box] = Field(max_length=CHART_ELEMENTS)


class UnknownChart(Axes2D):
    type: Literal["unknown"]
    elements: list[None] = Field(max_length=0)


OneChart = Annotated[
    LineChart | ScatterChart | BarChart | PieChart | BoxChart | UnknownChart,
    Field(discriminator="type"),
]


class SuperChart(Chart):
    """A figure of several axes: one chart each."""

    type: Literal["superchart"]
    elements: list[OneChart] = Field(max_length=CHART_AXES)


AnyChart: TypeAdapter = TypeAdapter(
    Annotated[
        LineChart | ScatterChart | BarChart | PieChart | BoxChart | UnknownChart | SuperChart,
        Field(discriminator="type"),
    ]
)


Cell = bool | int | float | Text | None


class TableColumn(Strict):
    name: Text
    dtype: Text


class TableIndex(Strict):
    name: Text | None
    values: list[Cell] = Field(max_length=TABLE_ROWS)


class TableData(Strict):
    """A DataFrame's shape, its columns and its first rows (at most TABLE_ROWS and
    TABLE_COLUMNS of them), each row as long as the columns."""

    shape: tuple[Count, Count]
    columns: list[TableColumn] = Field(max_length=TABLE_COLUMNS)
    index: TableIndex
    rows: list[list[Cell]] = Field(max_length=TABLE_ROWS)

    @model_validator(mode="after")
    def rows_fit_columns(self) -> TableData:
        if any(len(row) != len(self.columns) for row in self.rows):
            raise ValueError("a row is not as long as the columns")
        if len(self.index.values) != len(self.rows):
            raise ValueError("the index is not as long as the rows")
        return self


AnyTable: TypeAdapter = TypeAdapter(TableData)


def taken(data: dict[str, str]) -> tuple[dict | None, dict | None, list[str]]:
    """The chart and the table of a result's data, each removed from `data` and checked (None
    when absent or refused), and a note for each refused."""
    chart, chart_note = _checked(data.pop(CHART_MIME, None), "chart", AnyChart)
    table, table_note = _checked(data.pop(TABLE_MIME, None), "table", AnyTable)
    return chart, table, [note for note in (chart_note, table_note) if note]


def _checked(text: object, what: str, schema: TypeAdapter) -> tuple[dict | None, str | None]:
    if text is None:
        return None, None
    if not isinstance(text, str):
        return None, f"[a {what}'s data was dropped: not JSON text]"
    size = len(text.encode("utf-8", "replace"))
    if size > DATA_BYTES:
        return None, (
            f"[a {what}'s data was dropped: {size:,} bytes, over the {DATA_BYTES // 1024} KiB "
            "a chart or table may send]"
        )
    try:
        model = schema.validate_json(text)
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"][:6])[:NOTE_CHARS] or "the top"
        said = first["msg"].lower()[:NOTE_CHARS]  # it may quote the input
        return None, f"[a {what}'s data was dropped: at {where}, {said}]"
    return model.model_dump(mode="json", exclude_none=False), None
