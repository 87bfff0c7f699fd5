"""The one result type of running a cell, used by every caller and test."""

from dataclasses import asdict, dataclass, field

from sandcell.sandbox.boundary import PATH_KEY

# Stands in the stream for the middle of the output the caps cut (see Execution.cut_at).
CUT_NOTE = "\n[... {n} characters cut by the sandbox ...]\n"


@dataclass
class StreamChunk:
    name: str  # "stdout" or "stderr"
    text: str


@dataclass
class Result:
    """A rich output (execute_result or display_data): data by MIME type."""

    data: dict[str, str]
    metadata: dict = field(default_factory=dict)
    is_main: bool = False  # the value of the cell's last expression
    # the data behind a chart (a matplotlib figure) or a table (a DataFrame) it shows, checked
    # (sandbox/rich_data.py); notes say what was refused
    chart: dict | None = None
    table: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def path(self) -> str | None:
        """Workspace path where an image of this result was saved, if any."""
        return self.metadata.get(PATH_KEY)


@dataclass
class ExecutionError:
    name: str
    value: str
    traceback: list[str]  # compact: ANSI stripped, frames in the user's code


@dataclass
class Execution:
    code: str = ""
    stream: list[StreamChunk] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    interrupted: bool = False  # stopped by interrupt (deadline or caller); state kept
    restarted: str | None = (
        None  # why a fresh kernel was started: "timeout", "out of memory", "died"
    )
    # output cut by the caps: stream characters (kernel and host), and the bytes of any
    # message the relay dropped
    dropped_bytes: int = 0
    cut_at: int | None = None  # index in `stream` of the CUT_NOTE chunk, when the middle was cut
    cut_chars: int = 0  # stream characters cut there, exactly
    saved_output: str | None = None  # workspace path of the cell's complete output (its log)
    saved_truncated: int | None = None  # bytes where that log stopped (its cap), if it did
    # rich outputs not kept (past Limits.rich_outputs or rich_bytes; the kernel's count and
    # the host's), and their size (boundary.rich_size)
    rich_dropped: int = 0
    rich_dropped_bytes: int = 0
    # --allow-net: the connections that ended while the cell ran (or since the last cell),
    # as the host's proxy recorded them (sandbox/net_proxy.py ConnectionRecord, as dicts)
    net: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.restarted is None

    @property
    def stdout(self) -> str:
        return "".join(c.text for c in self.stream if c.name == "stdout")

    @property
    def stderr(self) -> str:
        return "".join(c.text for c in self.stream if c.name == "stderr")

    @property
    def text(self) -> str | None:
        """text/plain of the cell's value, if the last line was an expression."""
        for r in self.results:
            if r.is_main:
                return r.data.get("text/plain")
        return None

    @property
    def images(self) -> list[str]:
        return [r.path for r in self.results if r.path]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Execution":
        d = dict(d)
        d["stream"] = [StreamChunk(**c) for c in d.get("stream", [])]
        d["results"] = [Result(**r) for r in d.get("results", [])]
        d["error"] = ExecutionError(**d["error"]) if d.get("error") else None
        return cls(**d)
