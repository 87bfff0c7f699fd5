"""IPython extension loaded into every sandcell kernel.

- Caps the text a cell writes to stdout/stderr at the source: the first half of
  SANDCELL_OUTPUT_CHARS passes live, then only a short rolling tail is kept and sent after
  the cell, behind a marker that counts exactly what was cut in between.
- Spills the complete output of a cell that prints much to a log under boundary.LOGS (up to
  SANDCELL_SPILL_BYTES), so nothing the model cannot see is lost.
- Caps the rich outputs (display_data, execute_result) of a cell at the source: past
  SANDCELL_RICH_OUTPUTS displays or SANDCELL_RICH_BYTES in all, a display is not sent; the
  count and size of what was not sent go to the host in a marker at the end of the cell.
- Saves every PNG a cell displays under boundary.FIGURES and names the file in the display
  metadata (boundary.PATH_KEY), and sends the matplotlib figures a cell leaves open or shows
  under any backend (Agg too), once each.
- Shows pandas DataFrames and Series as bounded text that always states the shape (pandas 2
  and 3 name their classes' modules differently: both are registered).
- Sends the data behind each matplotlib figure and each DataFrame or Series shown, as JSON beside
  its image or text (sandcell_charts.py).
- Lets `%pip install` / `!pip install` take packages from the operator's wheelhouse when one
  is mounted (sandcell_pip.py), and makes a failed one a failed cell: the sandbox is offline.
"""

import base64
import functools
import importlib.machinery
import os
import sys
import threading
import weakref
from collections import deque

import boundary
import sandcell_charts as charts
import sandcell_pip as packages

LIMIT = int(os.environ.get(boundary.OUTPUT_CHARS_ENV, str(1 << 20)))
HEAD = LIMIT // 2  # passes live; the host keeps a head of the same size
TAIL = max(0, min(16384, LIMIT // 4))
SPILL_BYTES = int(os.environ.get(boundary.SPILL_BYTES_ENV, str(boundary.SPILL_BYTES)))
RICH_OUTPUTS = int(os.environ.get(boundary.RICH_OUTPUTS_ENV, str(boundary.RICH_OUTPUTS)))
RICH_BYTES = int(os.environ.get(boundary.RICH_BYTES_ENV, str(boundary.RICH_BYTES)))


class _Log:
    """The complete output of one cell, written once it passes SPILL_AFTER_CHARS."""

    def __init__(self, number: int | None):
        self.number = number
        self.pending: list[str] = []
        self.pending_chars = 0
        self.file = None
        self.written = 0
        self.stopped = number is None  # no cell running (output between cells): no log

    def add(self, text: str) -> str:
        """Keep text; returns a marker to send when the log opens or stops, else ""."""
        if self.stopped:
            return ""
        if self.file is None:
            self.pending.append(text)
            self.pending_chars += len(text)
            if self.pending_chars <= boundary.SPILL_AFTER_CHARS:
                return ""
            text, self.pending = "".join(self.pending), []
            try:
                self.file, path = _create_log(self.number)
            except OSError as error:
                self.stopped = True
                return f"\n[sandcell: the complete output is not saved: {error}]\n"
            return boundary.spill_marker(path) + self._write(text)
        return self._write(text)

    def _write(self, text: str) -> str:
        data = text.encode("utf-8", "backslashreplace")
        room = SPILL_BYTES - self.written
        try:
            self.file.write(data[:room])
        except OSError:  # a full workspace: the log stops where it is
            room = 0
        if len(data) <= room:
            self.written += len(data)
            return ""
        self.written += max(0, room)
        self.close()
        return boundary.spill_full_marker(self.written)

    def close(self) -> None:
        self.stopped = True  # a thread may still print after the cell: no second log
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
            self.file = None


def _create_log(number: int):
    os.makedirs(boundary.LOGS, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    for attempt in range(1, 1000):  # a restarted kernel counts from 1 again: keep older logs
        path = f"{boundary.LOGS}/cell-{number}{'' if attempt == 1 else f'-{attempt}'}.txt"
        try:
            return os.fdopen(os.open(path, flags, 0o644), "wb"), path
        except FileExistsError:
            continue
    raise OSError(f"too many logs of cell {number} in {boundary.LOGS}")


class _Cell:
    """What one cell wrote: how much passed, the rolling tail, the exact count cut between."""

    def __init__(self, number: int | None = None):
        self.pid = os.getpid()
        self.sent = 0
        self.tail: deque = deque()  # [stream, text], oldest first
        self.tail_chars = 0
        self.cut = 0
        self.cut_stream = None  # the stream where the cut began
        self.streams: set = set()  # every stream written to, to flush in order at the end
        self.log = _Log(number)

    def take(self, stream, text: str) -> tuple[str, str]:
        """(text to pass on now, marker to send first)."""
        marker = self.log.add(text)
        self.streams.add(stream)
        room = max(0, HEAD - self.sent)
        if len(text) <= room:
            self.sent += len(text)
            return text, marker
        self.sent = HEAD
        self.cut_stream = self.cut_stream or stream
        self._to_tail(stream, text[room:])
        return text[:room], marker

    def _to_tail(self, stream, text: str) -> None:
        if len(text) >= TAIL:  # this text alone fills the tail: everything before it is cut
            self.cut += self.tail_chars + len(text) - TAIL
            self.tail.clear()
            self.tail_chars = 0
            text = text[len(text) - TAIL :]
        if text:
            self.tail.append([stream, text])
            self.tail_chars += len(text)
        # whole chunks only while writing (cheap); finish() trims the first one exactly
        while self.tail and self.tail_chars - len(self.tail[0][1]) >= TAIL:
            self.tail_chars -= len(self.tail[0][1])
            self.cut += len(self.tail.popleft()[1])

    def finish(self) -> list:
        """The tail to send, trimmed to TAIL exactly; closes the log."""
        excess = self.tail_chars - TAIL
        if excess > 0:
            self.tail[0][1] = self.tail[0][1][excess:]
            self.cut += excess
        self.log.close()
        return list(self.tail)


def _cap_streams(ip, end_marker) -> None:
    """end_marker() is the rich marker of the cell that ends ("" for none): written last, in
    every stream the cell wrote to, past the cap."""
    from ipykernel.iostream import OutStream

    original_write = OutStream.write
    stderr = sys.stderr if isinstance(sys.stderr, OutStream) else None  # before model code
    lock = threading.Lock()  # threads print too; the bookkeeping must stay whole
    state = {"cell": _Cell()}

    def write(self, string):
        if not isinstance(string, str) or state["cell"].pid != os.getpid():
            return original_write(self, string)  # a forked child must not touch the log
        with lock:
            passed, marker = state["cell"].take(self, string)
        if marker:
            original_write(self, marker)
        if passed:
            original_write(self, passed)
        return len(string)

    def begin(*_args) -> None:
        # run_cell counts the cell before pre_run_cell: this cell is the one before
        state["cell"] = _Cell(ip.execution_count - 1)

    def finish(*_args) -> None:
        with lock:
            cell, state["cell"] = state["cell"], _Cell()
            tail = cell.finish()
        if tail or cell.cut:
            _send_tail(cell, tail)
        # After everything the cell wrote: a marker model code printed comes before this one.
        marker = end_marker(bool(cell.streams))
        for stream in (cell.streams or ([stderr] if stderr else [])) if marker else []:
            original_write(stream, marker)
            # the kernel flushes sys.stdout and sys.stderr before it says the cell is done
            if stream is not sys.stdout and stream is not sys.stderr:
                stream.flush()

    def _send_tail(cell, tail) -> None:
        for stream in cell.streams:  # the head first: stdout and stderr buffer on their own
            stream.flush()
        runs: list = []  # [stream, texts]: consecutive chunks of one stream go as one write
        for stream, text in tail:
            if runs and runs[-1][0] is stream:
                runs[-1][1].append(text)
            else:
                runs.append([stream, [text]])
        if cell.cut:  # the marker goes right before the tail
            marker = boundary.dropped_marker(cell.cut_stream.name, cell.cut)
            runs = runs or [[cell.cut_stream, []]]
            runs[0][1].insert(0, marker)
        for stream, texts in runs:
            original_write(stream, "".join(texts))
            stream.flush()  # before the other stream's next run: in order across the two

    OutStream.write = write
    ip.events.register("pre_run_cell", begin)
    ip.events.register("post_run_cell", finish)


class _Rich:
    """The rich outputs of one cell: how many and how big were sent, and were not."""

    def __init__(self):
        self.sent = self.sent_bytes = self.dropped = self.dropped_bytes = 0

    def admit(self, *content) -> bool:
        size = boundary.rich_size(*content)
        if self.sent < RICH_OUTPUTS and self.sent_bytes + size <= RICH_BYTES:
            self.sent += 1
            self.sent_bytes += size
            return True
        self.dropped += 1
        self.dropped_bytes += size
        return False


def _cap_rich(ip):
    """Cap the cell's displays and its value at the source; returns end_marker(wrote) for the
    stream cap's end of cell: the rich marker, when anything was dropped or the cell wrote to
    a stream (where model code may have printed a marker of its own), else ""."""
    publisher, hook = ip.display_pub, ip.displayhook
    original_publish, original_finish = publisher.publish, hook.finish_displayhook
    lock = threading.Lock()
    state = {"cell": _Rich()}

    def admit(data, metadata) -> bool:
        with lock:
            return state["cell"].admit(data, metadata)

    def publish(data, metadata=None, *args, update=False, **kwargs):
        # an update replaces an earlier display in a live front end; the host ignores it
        if update or admit(data, metadata):
            return original_publish(data, metadata, *args, update=update, **kwargs)
        return None

    def finish_displayhook():
        content = hook.msg["content"] if hook.msg else {}
        if content.get("data") and not admit(content["data"], content.get("metadata")):
            hook.msg = None  # the original then sends nothing, and still flushes the streams
        return original_finish()

    def end_marker(wrote: bool) -> str:
        with lock:
            cell, state["cell"] = state["cell"], _Rich()
        if not cell.dropped and not wrote:
            return ""
        return boundary.rich_marker(cell.dropped, cell.dropped_bytes)

    publisher.publish = publish
    hook.finish_displayhook = finish_displayhook
    ip.events.register("pre_run_cell", lambda *_args: state.update(cell=_Rich()))
    return end_marker


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
                bundle = {"image/png": png, "text/plain": repr(fig)}
                chart = charts.chart_json(fig)
                if chart is not None:
                    bundle[boundary.CHART_MIME] = chart
                display(bundle, raw=True)

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
            df.to_string(  # wrapped at 80 as pandas' own text is: the model reads it
                max_rows=30,
                min_rows=10,
                max_cols=20,
                show_dimensions=True,
                max_colwidth=50,
                line_width=80,
            )
        )

    def series(s, p, cycle):
        p.text(s.to_string(max_rows=30, min_rows=10, length=True, dtype=True, name=True))

    for module in PANDAS_MODULES:
        plain.for_type_by_name(module["DataFrame"], "DataFrame", frame)
        plain.for_type_by_name(module["Series"], "Series", series)


# where pandas defines its classes: pandas 3 names them `pandas.DataFrame`, pandas 2 by file
PANDAS_MODULES = (
    {"DataFrame": "pandas", "Series": "pandas"},
    {"DataFrame": "pandas.core.frame", "Series": "pandas.core.series"},
)


def _data_formats(ip) -> None:
    """A figure's chart and a frame's table as formats of their own, computed with the image
    and the text wherever the object is displayed (display(), a cell's value, the inline
    backend's show). Each format is JSON text, or nothing. Matched by class name here rather
    than registered by type: the inline backend removes every formatter's Figure entry when
    pyplot is imported."""
    from IPython.core.formatters import BaseFormatter

    class DataFormat(BaseFormatter):
        _return_type = (str,)

        def __init__(self, mime: str, makers: dict, **kwargs):
            super().__init__(**kwargs)
            self.format_type, self.makers = mime, makers

        def __call__(self, obj):
            for cls in type(obj).__mro__:
                make = self.makers.get((cls.__module__, cls.__name__))
                if make is not None:
                    return make(obj)  # never raises: None when it cannot read obj
            return None

    chart = {("matplotlib.figure", "Figure"): charts.chart_json}
    table = {}
    for module in PANDAS_MODULES:
        table[(module["DataFrame"], "DataFrame")] = charts.table_json
        table[(module["Series"], "Series")] = charts.table_json
    formatters = ip.display_formatter.formatters
    for mime, makers in ((boundary.CHART_MIME, chart), (boundary.TABLE_MIME, table)):
        formatters[mime] = DataFormat(mime, makers, parent=ip.display_formatter)


def _offline_pip(ip) -> None:
    """`!cmd` and `%pip` both end in shell.system, which only stores the exit status in
    `_exit_code`. A pip install's names are checked first (sandcell_pip.py), and a pip install
    that failed fails the cell."""
    from IPython.utils.process import system

    def system_checked(cmd):
        if cmd.rstrip().endswith("&"):
            raise OSError("Background processes not supported.")
        cmd = ip.var_expand(cmd, depth=1)  # in the caller's frame, as system_piped does
        names = packages.requested(cmd)
        if names:
            packages.check(names)
        status = system(cmd)
        ip.user_ns["_exit_code"] = status
        if names is not None:
            if status != 0:
                raise packages.failed(status)
            packages.installed_now()

    ip.system = system_checked

    def pip(line):
        """%pip, as IPython's but without its "you may need to restart the kernel" note: the
        kernel sees what was installed at once (packages.installed_now)."""
        ip.system(f"{sys.executable} -m pip {line}")

    ip.register_magic_function(pip, "line", "pip")


def _on_iopub_thread(change) -> bool:
    """Run change(iopub_thread) on the IOPub thread's loop, which owns its sockets."""
    thread = get_ipython().kernel.iopub_thread  # noqa: F821 (a kernel's builtin)
    done = threading.Event()

    def call():
        try:
            change(thread)
        finally:
            done.set()

    thread.io_loop.add_callback(call)
    return done.wait(10)


def before_pause() -> bool:
    """The host pauses this sandbox next: close ipykernel's TCP listener on 127.0.0.1 (the
    pipe forked children print through), which gVisor cannot checkpoint while it waits."""

    def close(thread):
        if thread._pipe_flag:
            thread._pipe_flag = False
            thread._pipe_in.close()

    return _on_iopub_thread(close)


def after_resume() -> bool:
    """Restored (or the pause failed): the pipe for forked children again."""

    def reopen(thread):
        if not thread._pipe_flag:
            thread._pipe_flag = True
            thread._setup_pipe_in()

    return _on_iopub_thread(reopen)


def load_ipython_extension(ip) -> None:
    _save_figures(ip)
    end_marker = _cap_rich(ip)  # around _save_figures: a display not sent is not saved
    _send_open_figures(ip)  # before the stream cap's end of cell: its notes count as output
    _cap_streams(ip, end_marker)
    _bounded_pandas(ip)
    _data_formats(ip)
    packages.configure()
    _offline_pip(ip)
