"""IPython extension loaded into every sandcell kernel.

- Caps the text a cell writes to stdout/stderr at the source: the first
  SANDCELL_OUTPUT_CHARS characters pass, then only a short tail per stream is kept
  and emitted after the cell with a marker the host turns into a "dropped" count.
- Saves every PNG a cell displays under boundary.FIGURES and names the file in
  the display metadata (boundary.PATH_KEY), so the observation can point at it.
- Shows pandas DataFrames and Series as bounded text that always states the shape.
"""

import base64
import os
import sys

import boundary

LIMIT = int(os.environ.get(boundary.OUTPUT_CHARS_ENV, str(1 << 20)))
TAIL = max(0, min(16384, LIMIT // 4))


class _Budget:
    def __init__(self) -> None:
        self.reset()

    def reset(self, *_args) -> None:
        self.used = 0
        self.dropped: dict[str, int] = {}
        self.tails: dict[str, str] = {}


def _cap_streams(ip, budget: _Budget) -> None:
    from ipykernel.iostream import OutStream

    original_write = OutStream.write

    def write(self, string):
        if not isinstance(string, str) or budget.used + len(string) <= LIMIT:
            if isinstance(string, str):
                budget.used += len(string)
            return original_write(self, string)
        room = max(0, LIMIT - budget.used)
        if room:
            original_write(self, string[:room])
            budget.used = LIMIT
        rest = string[room:]
        budget.dropped[self.name] = budget.dropped.get(self.name, 0) + len(rest)
        budget.tails[self.name] = (budget.tails.get(self.name, "") + rest)[-TAIL:] if TAIL else ""
        return len(string)

    def flush_tails(*_args) -> None:
        for stream in (sys.stdout, sys.stderr):
            name = getattr(stream, "name", None)
            if name not in budget.dropped:
                continue
            tail = budget.tails.get(name, "")
            original_write(stream, boundary.dropped_marker(name, budget.dropped[name] - len(tail)))
            original_write(stream, tail)
            stream.flush()
        budget.reset()

    OutStream.write = write
    ip.events.register("pre_run_cell", budget.reset)
    ip.events.register("post_run_cell", flush_tails)


def _save_figures(ip) -> None:
    publisher = ip.display_pub
    original_publish = publisher.publish

    def publish(data, metadata=None, *args, **kwargs):
        png = data.get("image/png") if isinstance(data, dict) else None
        if isinstance(png, str):
            metadata = dict(metadata or {})
            try:
                os.makedirs(boundary.FIGURES, exist_ok=True)
                number = len([n for n in os.listdir(boundary.FIGURES) if n.endswith(".png")]) + 1
                path = os.path.join(boundary.FIGURES, f"figure-{number}.png")
                while os.path.exists(path):
                    number += 1
                    path = os.path.join(boundary.FIGURES, f"figure-{number}.png")
                with open(path, "wb") as f:
                    f.write(base64.b64decode(png))
                metadata[boundary.PATH_KEY] = path
            except OSError as error:
                metadata[boundary.ERROR_KEY] = f"figure not saved: {error}"
        return original_publish(data, metadata, *args, **kwargs)

    publisher.publish = publish


def _bounded_pandas(ip) -> None:
    plain = ip.display_formatter.formatters["text/plain"]

    def frame(df, p, cycle):
        p.text(
            df.to_string(
                max_rows=30, min_rows=10, max_cols=20, show_dimensions=True, max_colwidth=50
            )
        )

    def series(s, p, cycle):
        p.text(s.to_string(max_rows=30, min_rows=10, length=True, dtype=True, name=True))

    plain.for_type_by_name("pandas.core.frame", "DataFrame", frame)
    plain.for_type_by_name("pandas.core.series", "Series", series)


def load_ipython_extension(ip) -> None:
    _cap_streams(ip, _Budget())
    _save_figures(ip)
    _bounded_pandas(ip)
