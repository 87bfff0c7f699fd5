"""A chart's data as a few lines for the model (sandbox/render.py puts them under the image):
type, title, axes, and the values, so a model that cannot see the picture can check it. Long
series give their count, their ranges and a few points kept evenly."""

from __future__ import annotations

from collections.abc import Callable

ALL_POINTS = 12  # a series this long or shorter is given whole
SOME_POINTS = 5


def chart_text(chart: dict) -> str:
    return "\n".join(_lines(chart, ""))


def _lines(chart: dict, indent: str) -> list[str]:
    kind = chart["type"]
    if kind == "superchart":
        head = [f"{indent}[figure{_title(chart)}: {len(chart['elements'])} charts]"]
        return head + [line for c in chart["elements"] for line in _lines(c, indent + "  ")]
    name = "box plot" if kind == "box_and_whisker" else f"{kind} chart"
    lines = [f"{indent}[{name}{_title(chart)}{_axes(chart)}]"]
    body = BODIES.get(kind)
    lines += [f"{indent}  {line}" for line in (body(chart) if body else [])]
    cut = chart.get("truncated")
    if cut and cut.get("elements"):
        lines.append(f"{indent}  ({cut['elements']:,} in all, the first {cut['kept']:,} kept)")
    return lines


def _title(chart: dict) -> str:
    return f' "{chart["title"]}"' if chart.get("title") else ""


def _axes(chart: dict) -> str:
    said = []
    for axis in ("x", "y"):
        label, scale = chart.get(f"{axis}_label"), chart.get(f"{axis}_scale")
        if label or scale not in (None, "linear", "categorical"):
            said.append(f"{axis}: {label or '?'}" + (f" ({scale})" if scale else ""))
    return "; " + "; ".join(said) if said else ""


def _series(chart: dict) -> list[str]:
    lines = []
    for series in chart["elements"]:
        points = series["points"]
        total = (series.get("truncated") or {}).get("points") or len(points)
        if total <= ALL_POINTS:
            lines.append(f"{series['label']}: " + ", ".join(_point(p) for p in points))
            continue
        step = max(1, (len(points) - 1) // (SOME_POINTS - 1))
        some = points[::step][: SOME_POINTS - 1] + points[-1:]
        ranges = f"x {_range([p[0] for p in points])}, y {_range([p[1] for p in points])}"
        lines.append(
            f"{series['label']}: {total:,} points, {ranges}; some: "
            + ", ".join(_point(p) for p in some)
        )
    return lines


def _range(values: list) -> str:
    """Lowest to highest of numbers; first to last of texts (dates, categories)."""
    numbers = [v for v in values if isinstance(v, int | float)]
    if numbers:
        return f"{_v(min(numbers))} to {_v(max(numbers))}"
    texts = [v for v in values if v is not None]
    return f"{_v(texts[0])} to {_v(texts[-1])}" if texts else "none"


def _bars(chart: dict) -> list[str]:
    groups: dict[str, list[str]] = {}
    for bar in chart["elements"]:
        groups.setdefault(bar["group"], []).append(f"{bar['label']} {_v(bar['value'])}")
    if len(groups) == 1:
        return [", ".join(next(iter(groups.values())))]
    return [f"{group}: {', '.join(bars)}" for group, bars in groups.items()]


def _wedges(chart: dict) -> list[str]:
    return [", ".join(f"{w['label']} {w['angle'] / 3.6:.1f}%" for w in chart["elements"])]


def _boxes(chart: dict) -> list[str]:
    lines = []
    for box in chart["elements"]:
        numbers = ", ".join(
            f"{key.replace('_', ' ')} {_v(box[key])}"
            for key in ("min", "first_quartile", "median", "third_quartile", "max")
        )
        outliers = f"; {len(box['outliers'])} outliers" if box["outliers"] else ""
        lines.append(f"{box['label']}: {numbers}{outliers}")
    return lines


def _point(point: list) -> str:
    return f"({_v(point[0])}, {_v(point[1])})"


def _v(value: object) -> str:
    if value is None:
        return "NaN"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


BODIES: dict[str, Callable[[dict], list[str]]] = {
    "line": _series, "scatter": _series, "bar": _bars, "pie": _wedges, "box_and_whisker": _boxes,
}  # fmt: skip
