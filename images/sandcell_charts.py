"""The data behind what a cell shows, as JSON text beside its image or text: a matplotlib
figure's chart (boundary.CHART_MIME) in the shape E2B's code interpreter gives (type, title,
axes, elements), and a pandas DataFrame's or Series' first rows (boundary.TABLE_MIME).

Bounded by the caps in boundary.py: series are cut to a number of points kept evenly over their
whole range (and say so), long lists to their first items, texts to LABEL_CHARS, the JSON to
DATA_BYTES. A figure or frame that cannot be read gives None, never an error: the cell's image
and text go on as before. numpy, matplotlib and pandas are imported only when a cell shows one
of their objects, so a kernel starts as fast as without this module."""

import json
import math
import re
import reprlib

import boundary

UNIT = re.compile(r"\(([^()]*)\)\s*$|\[([^\[\]]*)\]")  # "Revenue (USD)", "Length [m]"
MATHTEXT = re.compile(r"^\$\\mathdefault\{(.*)\}\$$")  # a log axis' tick: $\mathdefault{10^{2}}$
SHORT = reprlib.Repr()  # a table cell holding a container: its first items (Python 3.11: no kwargs)
SHORT.maxlist = SHORT.maxtuple = SHORT.maxdict = SHORT.maxset = 10
SHORT.maxstring = SHORT.maxother = boundary.LABEL_CHARS
FITS = (1, 4, 16)  # points budget divisors tried until the chart's JSON fits DATA_BYTES


def chart_json(fig):
    """A figure's chart as JSON text, or None (nothing plotted, unreadable, too big)."""
    try:
        for divisor in FITS:
            chart = _figure(fig, boundary.CHART_POINTS // divisor)
            if chart is None:
                return None
            text = json.dumps(chart, allow_nan=False, separators=(",", ":"))
            if len(text.encode()) <= boundary.DATA_BYTES:
                return text
    except Exception:  # a chart is extra: the figure's image goes on without it
        return None
    return None


def table_json(obj):
    """A DataFrame's or Series' first rows as JSON text, or None."""
    try:
        frame = obj.to_frame() if obj.ndim == 1 else obj
        rows, columns = boundary.TABLE_ROWS, boundary.TABLE_COLUMNS
        for keep_rows, keep_columns in ((rows, columns), (rows, 20), (10, 10)):
            text = json.dumps(
                _table(frame, keep_rows, keep_columns), allow_nan=False, separators=(",", ":")
            )
            if len(text.encode()) <= boundary.DATA_BYTES:
                return text
    except Exception:
        return None
    return None


# -- charts ------------------------------------------------------------------------------------


def _figure(fig, points):
    axes = [ax for ax in fig.get_axes() if ax.has_data() and getattr(ax, "_colorbar", None) is None]
    if not axes:
        return None
    if len(axes) == 1:
        return _axes(axes[0], points)
    kept = axes[: boundary.CHART_AXES]
    chart = {
        "type": "superchart",
        "title": _title(fig.get_suptitle()),
        "elements": [_axes(ax, max(2, points // len(kept))) for ax in kept],
    }
    if len(axes) > len(kept):
        chart["truncated"] = {"elements": len(axes), "kept": len(kept)}
    return chart


def _axes(ax, points):
    kind, parts = _kind(ax)
    chart = {"type": kind, "title": _title(ax.get_title())}
    if kind == "pie":
        elements, total = _wedges(parts)
    elif kind == "unknown":
        chart.update(_labels(ax))
        elements, total = [], 0
    else:
        chart.update(_labels(ax))
        if kind in ("line", "scatter"):
            chart.update(_ticks(ax, "x"))
            chart.update(_ticks(ax, "y"))
        build = {"line": _series, "scatter": _series, "bar": _bars, "box_and_whisker": _boxes}
        elements, total = build[kind](ax, kind, parts, points)
    chart["elements"] = elements
    if total > len(elements):
        chart["truncated"] = {"elements": total, "kept": len(elements)}
    return chart


def _kind(ax):
    """The chart's type and the artists that hold its data."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    bars = [c for c in ax.containers if isinstance(c, BarContainer) and len(c)]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) and not _rule(line)]
    if wedges:
        return ("pie", wedges) if not (bars or scatters or lines) else ("unknown", None)
    if bars:  # lines beside bars are their error bars
        return ("bar", bars) if not scatters else ("unknown", None)
    boxes = _box_shapes(ax)
    if boxes:
        return "box_and_whisker", boxes
    if scatters:
        return ("scatter", scatters) if not lines else ("unknown", None)
    if lines:  # a band (fill_between, seaborn's interval) beside them is no data of its own
        return "line", lines
    return "unknown", None


def _rule(line) -> bool:
    """A two-point line along one axis: axhline, axvline, an error bar, a box's whisker."""
    if len(line.get_xdata()) != 2:
        return False
    x, y = line.get_xydata().T
    return bool(x[0] == x[1] or y[0] == y[1])


def _labels(ax):
    found = {}
    for axis in ("x", "y"):
        label = _text(getattr(ax, f"get_{axis}label")()) or None
        unit = UNIT.search(label or "")
        found[f"{axis}_label"] = label
        found[f"{axis}_unit"] = (unit.group(1) or unit.group(2)) if unit else None
    return found


def _ticks(ax, name):
    axis = getattr(ax, f"{name}axis")
    every = list(axis.get_majorticklocs())
    texts = axis.get_major_formatter().format_ticks(every)  # by position: all of them at once
    low, high = sorted(axis.get_view_interval())
    shown = [(v, t) for v, t in zip(every, texts, strict=True) if low <= v <= high]
    shown = shown[: boundary.CHART_TICKS]  # not those past the axis' ends
    as_date = _dates(axis)
    return {
        f"{name}_ticks": [as_date(v) if as_date else _number(v) for v, _ in shown],
        f"{name}_tick_labels": [_text(MATHTEXT.sub(r"\1", t)) for _, t in shown],
        f"{name}_scale": _scale(ax, axis, name),
    }


def _scale(ax, axis, name):
    from matplotlib.category import StrCategoryFormatter

    if _dates(axis):
        return "datetime"
    if isinstance(axis.get_major_formatter(), StrCategoryFormatter):
        return "categorical"
    return getattr(ax, f"get_{name}scale")()


def _dates(axis):
    """How this axis' numbers read as dates (an ISO text of each), or None when they do not:
    matplotlib's date numbers, or the period ordinals pandas' .plot() puts on a time axis."""
    from matplotlib import dates

    formatter = axis.get_major_formatter()
    if isinstance(
        formatter, dates.DateFormatter | dates.AutoDateFormatter | dates.ConciseDateFormatter
    ):
        return _date
    freq = getattr(formatter, "freq", None)
    if type(formatter).__name__ == "TimeSeries_DateFormatter" and freq is not None:
        import pandas as pd

        def period(v):
            return (
                None
                if not math.isfinite(v)
                else pd.Period(ordinal=int(v), freq=freq).start_time.isoformat()
            )

        return period
    return None


def _series(ax, kind, artists, points):
    kept = artists[: boundary.CHART_ELEMENTS]
    per_series = max(2, points // len(kept))
    x_date, y_date = _dates(ax.xaxis), _dates(ax.yaxis)
    series = []
    for number, artist in enumerate(kept, start=1):
        if kind == "line":
            x, y = artist.get_xdata(), artist.get_ydata()
            fallback = f"Line {number}"
        else:  # a scatter's offsets are numbers, dates too (matplotlib's date numbers)
            offsets = artist.get_offsets()
            x, y = offsets[:, 0], offsets[:, 1]
            fallback = f"Series {number}"
        xs, ys, total = _thinned(_plain(x), _plain(y), per_series)
        element = {
            "label": _label(artist.get_label(), fallback),
            "points": [list(p) for p in zip(_values(xs, x_date), _values(ys, y_date), strict=True)],
        }
        if len(element["points"]) < total:
            element["truncated"] = {"points": total, "kept": len(element["points"])}
        series.append(element)
    return series, len(artists)


def _plain(values):
    """A numpy array of the values; a masked number (hidden from the plot) as NaN."""
    import numpy as np

    if np.ma.isMaskedArray(values):
        if values.dtype.kind in "iufb":
            return np.ma.filled(values.astype(float), np.nan)
        return np.asarray(values.filled(None) if values.dtype.kind == "O" else values.data)
    return np.asarray(values)


def _thinned(x, y, most):
    """At most `most` of the points over the whole series, first and last kept: where y is
    numeric, each stretch's lowest and highest point (a spike is never thinned away), else
    points evenly apart."""
    import numpy as np

    total = min(len(x), len(y))
    x, y = x[:total], y[:total]
    if total <= most:
        return x, y, total
    if y.dtype.kind in "iuf":
        stretches = max(1, most // 2 - 1)
        low = np.where(np.isnan(y), np.inf, y) if y.dtype.kind == "f" else y
        high = np.where(np.isnan(y), -np.inf, y) if y.dtype.kind == "f" else y
        edges = np.linspace(0, total, stretches + 1).astype(np.int64)
        keep = {0, total - 1}
        for start, end in zip(edges[:-1], edges[1:], strict=True):
            if end > start:
                keep.add(start + int(np.argmin(low[start:end])))
                keep.add(start + int(np.argmax(high[start:end])))
        chosen = np.array(sorted(keep), dtype=np.int64)
    else:
        chosen = np.unique(np.linspace(0, total - 1, most).round().astype(np.int64))
    return x[chosen], y[chosen], total


def _values(array, as_date):
    """JSON values of a numpy array: numbers (None for NaN), ISO dates, capped texts."""
    kind = array.dtype.kind
    if kind in "iub":
        return [as_date(float(v)) if as_date else float(v) for v in array.tolist()]
    if kind == "f":
        return [as_date(v) if as_date else _number(v) for v in array.tolist()]
    if kind == "M":
        return [
            None if s == "NaT" else s for s in array.astype("datetime64[s]").astype(str).tolist()
        ]
    return [_value(v) for v in array.tolist()]


def _bars(ax, kind, containers, points):
    total = sum(len(container) for container in containers)
    elements = []
    for number, container in enumerate(containers, start=1):
        group = _label(container.get_label(), f"Group {number}")
        horizontal = getattr(container, "orientation", None) == "horizontal"
        name = _namer(ax.yaxis if horizontal else ax.xaxis)
        for rect in container:
            if len(elements) == boundary.CHART_ELEMENTS:
                return elements, total
            if horizontal:
                start, width, value = rect.get_y(), rect.get_height(), rect.get_width()
            else:
                start, width, value = rect.get_x(), rect.get_width(), rect.get_height()
            label = name(start, start + width)
            elements.append({"label": label, "group": group, "value": _number(value)})
    return elements, total


def _namer(axis):
    """A function naming the stretch [low, high] of this axis: its date on a date axis; where
    the ticks name categories (strings plotted, or names given to ticks placed by hand), the
    nearest tick's name; else its middle as a number."""
    import numpy as np

    as_date = _dates(axis)
    if as_date:
        return lambda low, high: as_date((low + high) / 2)
    locations = np.asarray(axis.get_majorticklocs(), dtype=float)
    texts = axis.get_major_formatter().format_ticks(list(locations))
    if not len(locations) or all(_numeric(t) for t in texts):
        return lambda low, high: _text(f"{(low + high) / 2:.10g}")
    order = np.argsort(locations)
    locations, texts = locations[order], [texts[i] for i in order]

    def name(low, high):
        middle = (low + high) / 2
        at = int(np.searchsorted(locations, middle))
        near = [i for i in (at - 1, at) if 0 <= i < len(locations)]
        return _text(texts[min(near, key=lambda i: abs(locations[i] - middle))])

    return name


def _numeric(text) -> bool:
    try:
        float(str(text).replace("\u2212", "-"))
    except ValueError:
        return False
    return True


def _wedges(wedges):
    kept = wedges[: boundary.CHART_ELEMENTS]
    elements = [
        {
            "label": _label(wedge.get_label(), f"Wedge {number}"),
            "angle": round(abs(float(wedge.theta2) - float(wedge.theta1)), 6),
            "radius": _number(wedge.r),
        }
        for number, wedge in enumerate(kept, start=1)
    ]
    return elements, len(wedges)


def _box_shapes(ax):
    """The boxes of a box plot as (low, high) along the category axis and (q1, q3) along the
    value axis, with the orientation: PathPatches (patch_artist, seaborn) or closed five-point
    lines (matplotlib's default), each a rectangle. The orientation is the median's: the line
    that crosses a box from one side to the other."""
    import numpy as np

    rectangles = []
    for artist in [*ax.patches, *ax.get_lines()]:
        if type(artist).__name__ == "PathPatch":
            vertices = np.asarray(artist.get_path().vertices)
        elif type(artist).__name__ == "Line2D" and len(artist.get_xdata()) == 5:
            vertices = np.asarray(artist.get_xydata())
        else:
            continue
        xs, ys = np.unique(vertices[:, 0].round(9)), np.unique(vertices[:, 1].round(9))
        if len(xs) == 2 and len(ys) == 2:
            rectangles.append((xs, ys))
    if not rectangles:
        return None
    vertical = True
    for line in ax.get_lines():
        if len(line.get_xdata()) != 2:
            continue
        x, y = np.asarray(line.get_xydata(), float).T.round(9)
        across = [
            (xs, ys) for xs, ys in rectangles if sorted(x) == list(xs) or sorted(y) == list(ys)
        ]
        if any(
            y[0] == y[1] and sorted(x) == list(xs) and ys[0] <= y[0] <= ys[1] for xs, ys in across
        ):
            break  # a median across a box standing up: values on y
        if any(
            x[0] == x[1] and sorted(y) == list(ys) and xs[0] <= x[0] <= xs[1] for xs, ys in across
        ):
            vertical = False
            break
    if vertical:
        return [((xs[0], xs[1]), (ys[0], ys[1]), True) for xs, ys in rectangles]
    return [((ys[0], ys[1]), (xs[0], xs[1]), False) for xs, ys in rectangles]


def _boxes(ax, kind, shapes, points):
    import numpy as np

    vertical = shapes[0][2]
    name = _namer(ax.xaxis if vertical else ax.yaxis)
    lines = []  # (lowest, highest position, positions, values, only markers) of each line
    for line in ax.get_lines():
        x, y = _plain(line.get_xdata()).astype(float), _plain(line.get_ydata()).astype(float)
        positions, values = (x, y) if vertical else (y, x)
        if len(positions):
            markers = str(line.get_linestyle()) in ("None", "none", "", " ")
            lines.append((positions.min(), positions.max(), positions, values, markers))
    boxes = []
    kept = sorted(shapes, key=lambda shape: shape[0])[: boundary.CHART_ELEMENTS]
    for (low, high), (q1, q3), _ in kept:
        box = {"label": name(low, high), "min": q1, "first_quartile": q1, "median": None}
        box |= {"third_quartile": q3, "max": q3}
        marks = []
        for lowest, highest, positions, values, markers in lines:
            if not (low <= lowest and highest <= high):
                continue
            if markers:  # fliers, or a mean's marker: told apart once the whiskers are known
                marks += values[np.isfinite(values)].tolist()
            elif len(values) == 2 and values[0] == values[1] and q1 <= values[0] <= q3:
                if positions[0] != positions[1]:  # across the box, not a point
                    box["median"] = values[0]
            elif len(values) == 2 and positions[0] == positions[1]:  # a whisker
                if values.max() <= q1:
                    box["min"] = values.min()
                elif values.min() >= q3:
                    box["max"] = values.max()
        outliers = [v for v in marks if v < box["min"] or v > box["max"]]
        box["outliers"] = [_number(v) for v in outliers[: boundary.CHART_OUTLIERS]]
        boxes.append({k: _number(v) if isinstance(v, float) else v for k, v in box.items()})
    return boxes, len(shapes)


# -- tables ------------------------------------------------------------------------------------


def _table(frame, rows, columns):
    head = frame.iloc[:rows, :columns]
    index = head.index
    return {
        "shape": [int(frame.shape[0]), int(frame.shape[1])],
        "columns": [
            {"name": _text(str(name)), "dtype": _text(str(dtype))}
            for name, dtype in head.dtypes.items()
        ],
        "index": {
            "name": None if index.name is None else _text(str(index.name)),
            "values": [_value(v) for v in index.tolist()],
        },
        "rows": [[_value(v) for v in row] for row in head.itertuples(index=False, name=None)],
    }


# -- values ------------------------------------------------------------------------------------


def _value(v):
    """Any cell or point value as JSON: a number, a boolean, an ISO date, a capped text."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if abs(v) < 2**53 else str(v)
    if isinstance(v, float):
        return _number(v)
    if isinstance(v, str):
        return _text(v)
    if hasattr(v, "isoformat"):  # datetime, date, Timestamp; NaT says "NaT"
        return None if str(v) == "NaT" else _text(v.isoformat())
    if type(v).__module__ == "numpy" and getattr(v, "ndim", None) == 0:  # a numpy scalar
        return _value(v.item())
    if type(v).__name__ in ("NAType", "NaTType"):  # pandas' missing values
        return None
    return _text(SHORT.repr(v))  # a list, a dict, an array in a cell: its first items only


def _number(v):
    v = float(v)
    return v if math.isfinite(v) else None


def _date(v):
    from matplotlib import dates

    return None if not math.isfinite(v) else dates.num2date(v).isoformat()


def _title(text):
    return _text(text) or None


def _label(text, fallback):
    """An artist's label, or the fallback when matplotlib named it itself ("_child0")."""
    text = _text(text)
    return fallback if not text or text.startswith("_") else text


def _text(text) -> str:
    return str(text)[: boundary.LABEL_CHARS]
