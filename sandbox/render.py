"""The observation the model sees of one Execution: bounded text, never the raw stream."""

import re
from dataclasses import dataclass, field

from sandcell.sandbox.boundary import ERROR_KEY, PACKAGES_FILE
from sandcell.sandbox.chart_text import chart_text
from sandcell.sandbox.execution import Execution, Result

IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")
# The image's main packages, for the offline note (tests check them against requirements.in).
MAIN_PACKAGES = ["pandas", "numpy", "scipy", "scikit-learn", "statsmodels", "matplotlib"]
MAIN_PACKAGES += ["seaborn", "polars", "duckdb", "pyarrow", "openpyxl"]
# What code that reached for the network or a package download leaves behind.
OFFLINE = re.compile(
    r"gaierror|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|URLError|\bConnectionError|NewConnectionError|MaxRetryError|"
    r"PackageInstallError|PackageNotOffered|No matching distribution found"
)
OFFLINE_NOTE = (
    "[The sandbox is offline by design: no network, no package downloads. Installed: "
    f"{', '.join(MAIN_PACKAGES)} (all of them: {PACKAGES_FILE}). `%pip install NAME` works only "
    "for packages the operator's wheelhouse offers (named in the first message when there is "
    "one); for others ask the user to run `sandcell packages add NAME`, or do without]"
)


# What to do when the data does not fit in the sandbox's memory: said by the first prompt of a
# session with big inputs (agent.prompts) and after an out-of-memory restart.
MEMORY_ADVICE = (
    "Do not read it all at once with pandas: read only the columns you need (usecols=) in "
    "chunks (pd.read_csv(..., chunksize=500_000)), or query the file lazily with DuckDB "
    "(duckdb.sql(\"SELECT ... FROM '/data/FILE.csv'\").df()) or Polars "
    "(pl.scan_csv('/data/FILE.csv').group_by(...).agg(...).collect()); both are installed."
)
MEMORY_FLAG = "--memory"  # the sandcell option that raises the sandbox's memory


def cut(text: str, budget: int, saved: str | None = None) -> str:
    """Head + tail of text within budget, with a marker saying how much was cut and where
    the full text is."""
    return _head_tail(text, "", 0, budget, _where(saved, None))


def _where(saved: str | None, truncated: int | None) -> str:
    if not saved:
        return ""
    if truncated is None:
        return f"; the whole output is in {saved}"
    return f"; the first {_size(truncated)} of it are in {saved} (truncated there: the log's cap)"


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def _head_tail(head: str, tail: str, gap: int, budget: int, where: str) -> str:
    """Show a head of `head` and a tail of `tail` within budget; `gap` characters are known
    to be cut between them already. The marker counts exactly the characters not shown."""
    if not gap and len(head) + len(tail) <= budget:
        return head + tail
    if not gap:  # one text: the cut may fall anywhere in it
        head, tail = head + tail, ""
    total = len(head) + gap + len(tail)
    marker = "\n[... {n} characters cut" + where + " ...]\n"
    room = max(0, budget - len(marker.format(n=total)))
    if gap:  # neither side can lend text across the gap
        t = min(len(tail), room - min(len(head), room * 2 // 3))
        h = min(len(head), room - t)
        shown_head, shown_tail = head[:h], tail[len(tail) - t :] if t else ""
    else:
        shown_head = head[: room * 2 // 3]
        shown_tail = head[len(head) - room // 3 :] if room // 3 else ""
    n = total - len(shown_head) - len(shown_tail)
    return shown_head + marker.format(n=n) + shown_tail


def _stream(execution: Execution, budget: int) -> str:
    chunks, at = execution.stream, execution.cut_at
    where = _where(execution.saved_output, execution.saved_truncated)
    if at is None:
        return _head_tail("".join(c.text for c in chunks), "", 0, budget, where)
    head = "".join(c.text for c in chunks[:at])
    tail = "".join(c.text for c in chunks[at + 1 :])
    return _head_tail(head, tail, execution.cut_chars, budget, where)


@dataclass
class Parts:
    """An observation's parts, rendered: what a front end that streamed the cell's output
    shows after it (results, error, notes), and the stream itself."""

    stream: str = ""
    results: list[str] = field(default_factory=list)  # one per Execution.results
    error: str | None = None  # the compact traceback
    notes: list[str] = field(default_factory=list)  # caps, restarts, timeouts, offline


def parts(execution: Execution, budget: int = 4000, memory_mb: int | None = None) -> Parts:
    """The observation's parts; `memory_mb`, the sandbox's memory, is named after an
    out-of-memory restart."""
    out = Parts()
    if execution.stream:
        out.stream = _stream(execution, budget * 3 // 5)
    out.results = [_result(result, budget // 3) for result in execution.results]
    if execution.error is not None:
        err = execution.error
        trace = "\n".join(line for line in err.traceback[:-1] if line.strip())
        out.error = cut(f"{trace}\n{err.name}: {err.value}".strip(), budget // 3)
    relay_dropped = execution.dropped_bytes - execution.cut_chars
    if relay_dropped > 0:
        out.notes.append(f"[{relay_dropped} bytes of output were dropped by the sandbox]")
    if execution.rich_dropped:
        out.notes.append(_rich_note(execution))
    if execution.restarted:
        out.notes.append(_restart_note(execution.restarted, memory_mb))
    elif execution.timed_out:
        out.notes.append(
            f"[Timed out after {execution.duration_s:.0f} s: the cell was interrupted; "
            "variables are kept. Make the code faster or work on a sample.]"
        )
    if _offline(execution):
        out.notes.append(OFFLINE_NOTE)
    return out


def joined(texts: list[str]) -> str:
    return "\n".join(t.rstrip("\n") for t in texts if t)


def render(execution: Execution, budget: int = 4000, memory_mb: int | None = None) -> str:
    p = parts(execution, budget, memory_mb)
    text = joined([p.stream, *p.results, p.error or "", *p.notes])
    return cut(text, budget) if text else "[ran without output]"


def _offline(execution: Execution) -> bool:
    """Did the cell reach for the network (or pip) and fail?"""
    texts = [c.text for c in execution.stream]
    if execution.error is not None:
        err = execution.error
        texts += [err.name, err.value, *err.traceback]
    return any(OFFLINE.search(text) for text in texts)


def _result(result: Result, budget: int) -> str:
    notes = "".join(f"\n{note}" for note in result.notes)
    image = next((t for t in IMAGE_TYPES if t in result.data), None)
    if image:
        where = result.path or result.metadata.get(ERROR_KEY, "not saved")
        shown = f"[image {image} saved to {where}]"
        if result.chart is not None:  # what the picture shows, for a model that cannot see it
            shown += "\n" + chart_text(result.chart)
        return cut(shown + notes, budget)
    text = result.data.get("text/plain")
    if text is None:
        kinds = ", ".join(sorted(result.data)) or "nothing"
        return f"[display of {kinds}]{notes}"
    return cut(text + notes, budget)


def _rich_note(execution: Execution) -> str:
    n, size = execution.rich_dropped, _size(execution.rich_dropped_bytes)
    outputs = "output was" if n == 1 else "outputs were"
    return (
        f"[{n} displayed {outputs} dropped ({size}): past the sandbox's cap on displays per "
        "cell. Display fewer or smaller results, or save them to files in /workspace.]"
    )


def _restart_note(restarted: str, memory_mb: int | None) -> str:
    limit = f"the sandbox has {memory_mb} MB; " if memory_mb else ""
    raise_it = f"sandcell's {MEMORY_FLAG} option raises it"
    why = {
        "timeout": "it did not stop after the timeout and an interrupt",
        "out of memory": f"it ran out of memory ({limit}{raise_it})",
        "died": "the kernel process died",
    }.get(restarted, restarted)
    advice = f" {MEMORY_ADVICE}" if restarted == "out of memory" else ""
    return (
        f"[The kernel was restarted because {why}. All variables are lost; files in "
        f"/workspace are kept. Re-run what you need.{advice}]"
    )
