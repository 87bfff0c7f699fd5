"""One typed event stream: each fact of a session is published once, as one of these frozen
dataclasses, to every subscriber (the trace writer, the console, the SSE stream, ...).

On the wire (trace.jsonl, one JSON object a line) an event is its fields plus one `type` tag;
the tags and field names are the trace's since its first version, so a trace written before
these classes existed reads back into them. Reading tolerates what another version wrote:
fields this one does not know are kept in `extra` (and written back), a missing field reads
as None, and an unknown tag becomes an `UnknownEvent` rather than an error.

`traced = False` marks what only a live front end needs (tokens, a running cell's output, the
step's parts as they happen): the trace keeps the whole `Step` instead."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from sandcell.agent.seams import Action
from sandcell.sandbox.execution import Execution
from sandcell.tools import ToolOutcome

REGISTRY: dict[str, type[Event]] = {}  # type tag -> class, filled as each class is defined
_BASE = ("time", "extra")  # fields every event has; not the event's own


@dataclass(frozen=True, kw_only=True)
class Event:
    tag: ClassVar[str] = ""
    traced: ClassVar[bool] = True  # written to trace.jsonl (else a live front end's only)
    time: str | None = None  # ISO time, as the trace stamped it (None until written)
    extra: dict = field(default_factory=dict)  # fields of another version, kept as read

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.tag:
            if cls.tag in REGISTRY:
                raise TypeError(f"two event classes have the type tag {cls.tag!r}")
            REGISTRY[cls.tag] = cls

    def to_json(self) -> dict:
        """The trace's JSON object: `type`, `time` once stamped, then the fields. A field
        whose default is None is left out while it is None (it did not apply)."""
        out: dict = {"type": self.tag}
        if self.time is not None:
            out["time"] = self.time
        for f in fields(self):
            if f.name in _BASE:
                continue
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue
            encode = f.metadata.get("encode")
            out[f.name] = encode(value) if encode and value is not None else value
        return out | self.extra

    @staticmethod
    def from_json(data: dict) -> Event:
        """The event a JSON object records; its class is chosen by its `type` tag alone."""
        cls = REGISTRY.get(str(data.get("type")))
        if cls is None:
            rest = {k: v for k, v in data.items() if k not in ("type", "time")}
            return UnknownEvent(type=str(data.get("type")), data=rest, time=data.get("time"))
        own = {f.name: f for f in fields(cls) if f.name not in _BASE}
        kwargs: dict[str, Any] = {}
        for name, f in own.items():
            if name in data:
                decode = f.metadata.get("decode")
                value = data[name]
                kwargs[name] = decode(value) if decode and value is not None else value
            elif f.default is MISSING and f.default_factory is MISSING:
                kwargs[name] = None  # an older trace that did not record it
        extra = {k: v for k, v in data.items() if k not in own and k not in ("type", "time")}
        return cls(**kwargs, time=data.get("time"), extra=extra)


# A subscriber: called in the thread where the fact happened (the question's; a sandbox's
# start runs in the background), and it should return quickly.
OnEvent = Callable[[Event], None]


def fan_out(*subscribers: OnEvent | None) -> OnEvent:
    """One publish function that hands each event to every subscriber, in order."""
    listening = [s for s in subscribers if s is not None]

    def publish(event: Event) -> None:
        for subscriber in listening:
            subscriber(event)

    return publish


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """A record of a type this version does not know (a newer writer's): kept, not parsed."""

    type: str
    data: dict

    def to_json(self) -> dict:
        head = {"type": self.type} | ({"time": self.time} if self.time is not None else {})
        return head | self.data


def _items(entries: list | None) -> list[dict]:
    """The inputs a record names: {"name", "path", "size", "sha256"} each. Traces written
    before inputs were recorded whole hold plain paths; those get name and path."""
    items = []
    for entry in entries or []:
        if isinstance(entry, str):
            entry = {"name": Path(entry).name, "path": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ValueError(f"the trace's inputs are not recorded as paths: {entry!r}")
        items.append({"name": Path(entry["path"]).name, "size": None, "sha256": None, **entry})
    return items


# -- what the trace keeps ------------------------------------------------------------------


@dataclass(frozen=True)
class SessionStarted(Event):
    """One per process that ran the session (a served session continued after a restart
    has a second)."""

    tag = "session"
    model: str
    max_tokens: int | None  # the cap on each reply
    protocol: str
    inputs: list  # Inputs.to_trace(): {"name", "path", "size", "sha256"} each
    image: str
    limits: dict
    rules: dict
    sandbox_start: str
    vision: str | None = None  # --vision (traces before it had none)

    def input_items(self) -> list[dict]:
        return _items(self.inputs)


@dataclass(frozen=True)
class SandboxReady(Event):
    """When the session's sandbox began to start, how long it took and was waited for;
    `used` False when the session closed without using it."""

    tag = "sandbox"
    started_at: str | None
    start_s: float | None
    waited_s: float | None
    used: bool | None = None
    node: str | None = None  # the Ray node holding it (serve --ray), else None


@dataclass(frozen=True)
class SandboxStartFailed(Event):
    """The session's sandbox did not start (the engine, the image, a runtime): why, as said."""

    tag = "sandbox_failed"
    started_at: str | None
    start_s: float | None
    waited_s: float | None
    error: str
    node: str | None = None


@dataclass(frozen=True)
class ModelRequest(Event):
    """One request to the model endpoint, each retry its own: when it was sent (time.time()),
    how long it took, and its error ("429", "APITimeoutError") or its usage and finish."""

    tag = "model_request"
    model: str
    sent: float
    duration_s: float
    attempt: int = 0  # 0, then 1 for the first retry, ...
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    tokens_estimated: bool = False  # the endpoint sent no usage: characters / 4
    finish_reason: str | None = None


@dataclass(frozen=True)
class Question(Event):
    tag = "question"
    question: int  # its number in the conversation
    task: str


@dataclass(frozen=True)
class Step(Event):
    """One model call and what came of it: the actions run and their observations (the
    Execution of each python cell in full), an answer, or the feedback the model was given.
    A cell run without the model (serve's /execute) is a step 0 with `source` "execute"."""

    tag = "step"
    question: int
    step: int
    reply: dict | None = None  # Reply.to_dict()
    compacted: int | None = None  # older steps compacted to fit the context budget
    tool_choice: str | None = None
    thought: str | None = None
    cut: str | None = None  # what followed the action in the reply, not trusted
    observations: list[dict] | None = None  # observation_record() each
    warnings: list[str] | None = None
    answer: str | None = None
    nudge: str | None = None  # the answer was sent back with this
    error: str | None = None  # the reply was not usable: why
    feedback: str | None = None  # ... and what the model was told
    forced: bool | None = None  # the one answer asked for without tools at a limit
    source: str | None = None

    def executions(self) -> list[Execution]:
        """The python cells this step ran, in order, each in full."""
        return [
            Execution.from_dict(obs["execution"])
            for obs in self.observations or []
            if obs.get("tool") == "python" and obs.get("execution")
        ]


@dataclass(frozen=True)
class ProtocolChanged(Event):
    """`auto` fell back to text ReAct: the endpoint takes no tool definitions."""

    tag = "protocol"
    protocol: str
    reason: str

    @property
    def text(self) -> str:
        return f"the endpoint takes no tool definitions; using text ReAct ({self.reason})"


@dataclass(frozen=True)
class VisionOff(Event):
    """`--vision auto` stopped sending images: the endpoint refused a request for them. The
    request was sent again without them; none is sent for the rest of the session."""

    tag = "vision"
    reason: str
    images: int  # image parts taken out of the history

    @property
    def text(self) -> str:
        return (
            "the endpoint takes no images: the model no longer sees the figures, only their "
            f"file names (--vision off says so from the start; {self.reason})"
        )


@dataclass(frozen=True)
class Reset(Event):
    """A fresh kernel from here on: chat's /reset (the history emptied too), a served
    session's sandbox renewed after an idle release (`reason` "idle"), or another attempt at
    a batch job, its sandbox renewed (`reason` ATTEMPT: the next recipe, or the agent)."""

    tag = "reset"
    question: int
    reason: str | None = None


ATTEMPT = "attempt"  # Reset.reason: another attempt at a batch job, on a clean slate


@dataclass(frozen=True)
class InputsAdded(Event):
    tag = "inputs"
    added: list  # as SessionStarted.inputs

    def input_items(self) -> list[dict]:
        return _items(self.added)


@dataclass(frozen=True)
class SandboxReleased(Event):
    """A served session's container removed (`reason` "idle" or "shutdown"): its kernel is
    gone. `not_paused`: why it was not paused instead (gVisor keeps a paused kernel)."""

    tag = "sandbox_released"
    reason: str  # "idle", "shutdown", or "node_lost": the Ray node holding it is gone
    not_paused: str | None = None
    node: str | None = None  # the Ray node it was on (serve --ray)


@dataclass(frozen=True)
class NetConnection(Event):
    """A connection a cell asked for through the sandbox's proxy (--allow-net), as the host's
    proxy recorded it: where, how many bytes each way, and why it was refused or cut."""

    tag = "net"
    host: str
    port: int
    address: str | None = None  # the address it went to: the one the host checked
    sent: int = 0
    received: int = 0
    allowed: bool = False
    reason: str = ""

    def line(self) -> str:
        """One line for a person (the chat's screen, a job's audit); untrusted as it is."""
        where = f"{self.host}:{self.port}"
        if not self.allowed:
            return f"connection to {where} refused: {self.reason}"
        via = f" ({self.address})" if self.address and self.address != self.host else ""
        said = f"; {self.reason}" if self.reason else ""
        return f"connection to {where}{via}: {self.sent:,} bytes sent, {self.received:,} received{said}"


@dataclass(frozen=True)
class SandboxPaused(Event):
    """A served session's sandbox checkpointed into its folder and its container removed
    (`reason` "idle" or "shutdown"): the next use resumes the kernel as it was."""

    tag = "sandbox_paused"
    reason: str
    seconds: float
    size: int  # the checkpoint's bytes on disk
    node: str | None = None  # the Ray node it was paused on (serve --ray)


@dataclass(frozen=True)
class SandboxResumed(Event):
    """A paused sandbox restored (`error` None), or not (`error` says why: the fallback, a
    Reset or a Rebuilt, follows)."""

    tag = "sandbox_resumed"
    seconds: float
    error: str | None = None
    node: str | None = None  # the Ray node it was restored on (serve --ray)


@dataclass(frozen=True)
class Rebuilt(Event):
    """A fresh kernel brought to where the session left off by re-running its cells."""

    tag = "rebuilt"
    cells: int  # the recorded cells, in order
    skipped: int  # of those, the ones recorded as stopped: not run again
    reason: str  # "restart": the server restarted since; "node_lost": its Ray node went
    node: str | None = None  # the lost Ray node (reason "node_lost")
    seconds: float | None = None  # the cells' re-run took (traces before it had none)


@dataclass(frozen=True)
class ExportFailed(Event):
    """Files the code wrote were not copied back (a warning of the question)."""

    tag = "export_failed"
    error: str
    files: list[str] | None = None


@dataclass(frozen=True)
class Final(Event):
    """How a question ended: the answer (None without one), why it stopped, what it took."""

    tag = "final"
    question: int
    tokens: int
    duration_s: float
    answer: str | None
    stop_reason: str
    detail: str
    error: str | None
    steps: int


@dataclass(frozen=True)
class ChecksRun(Event):
    """The declared checks run on a final answer's outputs (in a fresh process in the
    sandbox): per output path {"passed", "sha256", "failures"}."""

    tag = "checks"
    question: int
    attempt: int  # the question's final answers checked so far, this one included
    passed: bool
    outputs: dict
    duration_s: float
    cpu_s: float | None = None  # the checker process's CPU-seconds


# -- what only a live front end shows --------------------------------------------------------


@dataclass(frozen=True)
class Token(Event):
    tag, traced = "token", False
    text: str


@dataclass(frozen=True)
class Thought(Event):
    tag, traced = "thought", False
    text: str


@dataclass(frozen=True)
class ActionStarted(Event):
    tag, traced = "action", False
    tool: str
    args: dict | str  # native tool calls carry their arguments as JSON text
    call_id: str | None = None  # a native tool call's id


@dataclass(frozen=True)
class Output(Event):
    """A running cell's stdout or stderr, as it arrives."""

    tag, traced = "output", False
    name: str  # "stdout" or "stderr"
    text: str


@dataclass(frozen=True)
class Observation(Event):
    tag, traced = "observation", False
    tool: str
    ok: bool
    text: str
    execution: Execution | None = field(
        default=None, metadata={"encode": Execution.to_dict, "decode": Execution.from_dict}
    )


@dataclass(frozen=True)
class Notice(Event):
    """A note to the model shown to the user (a nudge, feedback on an unusable reply), or
    a front end's own (`kernel_reset`: a served session's sandbox was renewed)."""

    tag, traced = "warning", False
    text: str
    kernel_reset: bool | None = None


# -- helpers for building the step records -------------------------------------------------


def observation_record(action: Any, outcome: Any) -> dict:
    """One action and its observation as the trace keeps them (the Execution in full)."""
    execution = outcome.data.to_dict() if hasattr(outcome.data, "to_dict") else None
    return {"tool": action.tool, "args": action.args, "call_id": action.call_id, "how": action.how,
            "ok": outcome.ok, "text": outcome.text, "execution": execution}  # fmt: skip


def executed_cell(question: int, code: str, ex: Execution) -> Step:
    """A cell run without the model (serve's /execute), recorded as a step so the notebook
    and replay hold it."""
    action = Action("python", {"code": code}, call_id=None, how="execute")
    record = observation_record(action, ToolOutcome(ex.ok, "", ex))
    return Step(question=question, step=0, source="execute", observations=[record])


def cell_events(question: int, code: str, ex: Execution) -> list[Event]:
    """A cell run without the model (serve's /execute, an MCP call): its step, then each
    connection it made through the sandbox's proxy (--allow-net), as the loop publishes them."""
    return [executed_cell(question, code, ex), *(NetConnection(**c) for c in ex.net)]


def sandbox_started(timing: dict) -> SandboxReady | SandboxStartFailed:
    """The event of a background start's timing (sandbox.background.OnReady's dict): ready,
    or failed where it holds an error."""
    if "error" in timing:
        return SandboxStartFailed(**timing)
    return SandboxReady(**timing)
