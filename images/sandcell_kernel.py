"""IPython extension loaded into every sandcell kernel.

- Caps the text a cell writes to stdout/stderr at the source: the first
  SANDCELL_OUTPUT_CHARS characters pass, then only a short tail per stream is kept
  and emitted after the cell with a marker the host turns into a "dropped" count.
- Saves every PNG a cell displays under boundary.FIGURES and names the file in the display
  metadata (boundary.PATH_KEY), and sends the matplotlib figures a cell leaves open or shows
  under any backend (Agg too), once each.
- Shows pandas DataFrames and Series as bounded text that always states the shape.
"""

import base64
import functools
import importlib.machinery
import os
import sys
import weakref

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


def _save_png(data, metadata):
    """Save a displayed PNG under FIGURES; returns the metadata naming the file."""
    png = data.get("image/png") if isinstance(data, dict) else None
    if not isinstance(png, str):
        return metadata
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
    return metadata


def _save_figures(ip) -> None:
    publisher, hook = ip.display_pub, ip.displayhook
    original_publish, original_result = publisher.publish, hook.write_format_data

    def publish(data, metadata=None, *args, **kwargs):
        return original_publish(data, _save_png(data, metadata), *args, **kwargs)

    def write_format_data(format_dict, md_dict=None):  # a figure as the cell's value
        return original_result(format_dict, _save_png(format_dict, md_dict))

    publisher.publish = publish
    hook.write_format_data = write_format_data


class _AfterImport:
    """A meta path finder that patches one module right after it is first imported, so
    nothing is imported before the code asks for it."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _send_open_figures(ip) -> None:
    """Every matplotlib figure a cell shows or leaves open comes back once as a PNG, whatever
    the backend: model code often picks Agg, whose show() displays nothing."""
    from IPython.core import pylabtools  # imports no matplotlib
    from IPython.display import display

    shown = weakref.WeakSet()  # figures this cell displayed, by any path
    original_print = pylabtools.print_figure

    def print_figure(fig, *args, **kwargs):
        shown.add(fig)
        return original_print(fig, *args, **kwargs)

    # every figure display goes through it: the inline backend's formatters bind it when
    # pyplot is first imported, after this
    pylabtools.print_figure = print_figure

    def open_figures() -> list:
        if "matplotlib.pyplot" not in sys.modules:
            return []
        from matplotlib._pylab_helpers import Gcf

        return [manager.canvas.figure for manager in Gcf.get_all_fig_managers()]

    def send(figures) -> None:
        for fig in figures:
            try:
                png = print_figure(fig, "png", base64=True)
            except Exception as error:  # one broken figure must not hide the others
                print(f"[figure not drawn: {type(error).__name__}: {error}]", file=sys.stderr)
                continue
            if png:  # None for a figure with nothing drawn on it
                display({"image/png": png, "text/plain": repr(fig)}, raw=True)

    def close(figures) -> None:
        if figures:
            pyplot = sys.modules["matplotlib.pyplot"]
            for fig in figures:
                pyplot.close(fig)

    def patch_show(pyplot) -> None:
        inline_show = pyplot.show

        @functools.wraps(inline_show)
        def show(*args, **kwargs):
            if "inline" in pyplot.get_backend():
                return inline_show(*args, **kwargs)  # displays and closes, like this
            figures = open_figures()
            send(figures)
            close(figures)

        pyplot.show = show

    def close_shown(*_args) -> None:
        # post_execute, before the inline backend's flush (registered later, on import):
        # a figure displayed by the code must not be flushed a second time
        close([fig for fig in open_figures() if fig in shown])

    def send_rest(*_args) -> None:
        figures = open_figures()
        send([fig for fig in figures if fig not in shown])
        close(figures)  # as the inline backend does: each cell starts with no figure
        shown.clear()

    sys.meta_path.insert(0, _AfterImport("matplotlib.pyplot", patch_show))
    ip.events.register("pre_run_cell", lambda *_args: shown.clear())
    ip.events.register("post_execute", close_shown)
    ip.events.register("post_run_cell", send_rest)


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
    _save_figures(ip)
    _send_open_figures(ip)  # before the stream cap's end of cell: its notes count as output
    _cap_streams(ip, _Budget())
    _bounded_pandas(ip)
