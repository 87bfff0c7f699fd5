"""A DataFrame laid out for a terminal of any width, from the HTML table the kernel sent.

The model reads a DataFrame as the kernel's text/plain (80 columns wide, bounded rows, the
shape stated); the same result also carries pandas' HTML table, which `chat` lays out here
at its panel's width: the index columns on the left of every block, as many data columns
per block as fit, the blocks one under the other (as pandas wraps a wide frame). The HTML is
untrusted: it is only parsed for text (stdlib's parser runs nothing), every cell and the
number of rows and columns are capped, and a cell's control characters are made visible
before it is measured (agent.cli.terminal), so they neither reach the terminal nor shift it."""

from __future__ import annotations

from html.parser import HTMLParser

from rich.cells import cell_len

from sandcell.agent.cli.terminal import visible

MAX_ROWS = 80  # header rows and body rows together (pandas' HTML holds at most 60 + "...")
MAX_COLUMNS = 42  # index and data columns (pandas' HTML holds at most 20 + "...")
MAX_CELL = 50  # characters of one cell (pandas' own max_colwidth)
GAP = "  "


class _Table(HTMLParser):
    """The first table's cells, row by row, each (text, is_header, colspan, rowspan); and the
    text after it (pandas writes the shape there: "5000 rows × 2 columns")."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.head: list[list[tuple]] = []
        self.body: list[list[tuple]] = []
        self.after: list[str] = []
        self._state = "before"  # before, in, after the first table
        self._in_head = False
        self._row: list[tuple] | None = None
        self._cell: list | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and self._state == "before":
            self._state = "in"
        if self._state != "in":
            return
        if tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
        elif tag in ("th", "td") and self._row is not None:
            spans = dict(attrs)
            self._cell = [[], tag == "th", _span(spans.get("colspan")), _span(spans.get("rowspan"))]

    def handle_endtag(self, tag: str) -> None:
        if self._state != "in":
            return
        if tag in ("th", "td") and self._cell is not None and self._row is not None:
            words, header, colspan, rowspan = self._cell
            text = _clip(visible(" ".join("".join(words).split())))
            self._row.append((text, header, colspan, rowspan))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            rows = self.head if self._in_head else self.body
            if len(self.head) + len(self.body) < MAX_ROWS:
                rows.append(self._row[:MAX_COLUMNS])
            self._row = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "table":
            self._state = "after"

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell[0].append(data)
        elif self._state == "after" and data.strip() and len(self.after) < 3:
            self.after.append(_clip(visible(" ".join(data.split()))))


def _span(value: str | None) -> int:
    return min(int(value), MAX_COLUMNS) if value and value.isdigit() and int(value) > 0 else 1


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _grid(rows: list[list[tuple]]) -> list[list[tuple[str, bool]]]:
    """Rows of (text, is_header) with colspans and rowspans filled in (with blanks, as pandas
    leaves a repeated index label blank)."""
    grid: list[list[tuple[str, bool]]] = []
    spanning: dict[int, int] = {}  # column -> rows it still spans
    for row in rows:
        line: list[tuple[str, bool]] = []
        cells = iter(row)
        while len(line) < MAX_COLUMNS:
            if spanning.get(len(line), 0) > 0:
                spanning[len(line)] -= 1
                line.append(("", True))
                continue
            cell = next(cells, None)
            if cell is None:
                break
            text, header, colspan, rowspan = cell
            if rowspan > 1:
                spanning[len(line)] = rowspan - 1
            line += [(text, header)] + [("", header)] * (colspan - 1)
        grid.append(line[:MAX_COLUMNS])
    return grid


def _pad(text: str, width: int, left: bool) -> str:
    room = " " * max(0, width - cell_len(text))
    return text + room if left else room + text


def table_text(html: str, width: int) -> str | None:
    """The first HTML table of `html` as text at most `width` cells wide (a single column
    wider than that alone excepted), or None when there is no table."""
    parsed = _Table()
    parsed.feed(html)
    parsed.close()
    head, body = _grid(parsed.head), _grid(parsed.body)
    rows = head + body
    if not rows or not any(rows):
        return None
    columns = max(len(row) for row in rows)
    rows = [row + [("", False)] * (columns - len(row)) for row in rows]
    # the index: the header cells a body row starts with (pandas writes row labels as <th>)
    first = body[0] if body else []
    index = next((i for i, (_, header) in enumerate(first) if not header), len(first))
    index = min(index, columns - 1) if columns > 1 else 0
    widths = [max(cell_len(row[c][0]) for row in rows) for c in range(columns)]
    left = sum(widths[:index]) + len(GAP) * index
    blocks: list[list[int]] = [[]]
    used = left
    for c in range(index, columns):
        need = widths[c] + (len(GAP) if used else 0)
        if blocks[-1] and used + need > width:
            blocks.append([])
            used = left
            need = widths[c] + (len(GAP) if used else 0)
        blocks[-1].append(c)
        used += need
    lines: list[str] = []
    for block in blocks:
        if lines:
            lines.append("")
        for row in rows:
            cells = [_pad(row[c][0], widths[c], True) for c in range(index)]
            cells += [_pad(row[c][0], widths[c], False) for c in block]
            lines.append(GAP.join(cells).rstrip())
    return "\n".join(lines + ([""] + parsed.after if parsed.after else []))
