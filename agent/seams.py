"""The seams of the agent as small types: what a model returns, what a protocol parses a reply
into, the Model protocol, and the few exceptions that leave the loop.

Everything else in `agent` is composed from these; nothing here imports a client or Docker."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import json_repair

# -- what a model returns -------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False  # the endpoint sent no usage; counted as characters / 4

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.estimated or other.estimated,
        )


def estimated_usage(messages: list[dict], completion_chars: int) -> Usage:
    """For endpoints (and scripts) that report no usage: characters / 4."""
    from sandcell.agent.vision import IMAGE_CHARS, image_count, text_of

    # an image counts as its fixed estimate, not as the characters of its data URL
    prompt = sum(len(text_of(m)) + IMAGE_CHARS * image_count(m) for m in messages)
    return Usage(prompt // 4, completion_chars // 4, estimated=True)


@dataclass(frozen=True)
class ModelAttempt:
    """One request to the model endpoint, retries each their own: how it went. `error` is the
    HTTP status ("429") or the exception's type ("APITimeoutError"); None when it answered."""

    started: float  # time.time() as it was sent
    duration_s: float
    number: int = 0  # 0, then 1 for the first retry, ...
    error: str | None = None
    usage: Usage | None = None  # an answered one's
    finish_reason: str | None = None

    @classmethod
    def failed(
        cls, started: float, begun: float, number: int, exc: BaseException | str
    ) -> ModelAttempt:
        """`exc`: what went wrong, or CANCELLED (the caller gave the request up)."""
        if isinstance(exc, str):
            return cls(started, time.monotonic() - begun, number, exc)
        status = getattr(exc, "status_code", None)
        name = type(exc).__name__
        error = str(status) if isinstance(status, int) else name.lstrip("_") or "error"
        return cls(started, time.monotonic() - begun, number, error)


OnAttempt = Callable[[ModelAttempt], None]
CANCELLED = "cancelled"  # a ModelAttempt's error when the caller gave it up (a Stop)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model wrote it; the registry repairs and checks it


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"  # "stop", "tool_calls", "length", ...
    usage: Usage = field(default_factory=Usage)
    duration_s: float = 0.0
    retries: int = 0  # transient errors (429, 5xx, timeouts) retried before this reply

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "tool_calls": [vars(c) for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": vars(self.usage),
            "duration_s": round(self.duration_s, 3),
            "retries": self.retries,
        }


OnToken = Callable[[str], None]


@runtime_checkable
class Model(Protocol):
    name: str

    def complete(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_choice: str | None = None,
        stop: list[str] | None = None,
        on_token: OnToken | None = None,
        deadline: float | None = None,  # time.monotonic() by which the caller gives up
        cancelled: Callable[[], bool] | None = None,  # true once the caller gave up early
        on_attempt: OnAttempt | None = None,  # each request sent, as it ends (metrics, spans)
    ) -> Reply: ...


# -- what a reply is parsed into -------------------------------------------------------------


@dataclass
class Action:
    tool: str
    args: dict | str  # a dict, or JSON text the registry repairs
    call_id: str | None = None  # native tool calls answer with this id
    # where it came from: tool_call (native), label, json_block, python_block, call (text
    # ReAct, agent.parsing), execute (a cell run without the model: serve's /execute)
    how: str = "tool_call"

    def key(self) -> str:
        """Identity for the repeated-action rule: tool name and canonical arguments."""
        args = self.args
        if isinstance(args, str):
            repaired = json_repair.repair_json(args, return_objects=True)
            args = repaired if isinstance(repaired, dict) and repaired else args.strip()
        return f"{self.tool}:{json.dumps(args, sort_keys=True, ensure_ascii=False, default=str)}"


@dataclass
class Parsed:
    thought: str = ""
    actions: list[Action] = field(default_factory=list)
    answer: str | None = None  # set when the reply is a final answer


# -- leaving the loop --------------------------------------------------------------------------


class FormatError(Exception):
    """The reply held neither a usable action nor a final answer. The message tells the model
    exactly what to send instead; `text` is the reply's prose, in case it was an unlabelled answer."""

    def __init__(self, message: str, text: str = ""):
        super().__init__(message)
        self.text = text


class Submitted(Exception):
    """The model gave a final answer (after the quality gate)."""

    def __init__(self, answer: str):
        super().__init__(answer)
        self.answer = answer


class LimitReached(Exception):
    """A stop condition fired. `reason` names it; `force_answer` asks for one last call without
    tools so the user still gets the best answer from what is known."""

    def __init__(self, reason: str, detail: str, force_answer: bool = False):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.force_answer = force_answer


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `timeout`, systemd, Kubernetes), raised in the main thread as
    Ctrl-C is, so whatever cleans up after Ctrl-C cleans up after it too."""

    def __init__(self) -> None:
        super().__init__("terminated (SIGTERM)")


class ModelError(Exception):
    """The model endpoint cannot be used (unreachable, key rejected, no such model, retries used
    up). The message names the URL and what to check; callers print it, never a traceback."""


class ToolsUnsupported(ModelError):
    """The endpoint refused a request because it carried tool definitions (`auto` falls back)."""


class ImagesUnsupported(ModelError):
    """The endpoint refused a request because it carried images (`--vision auto` sends it
    again without them)."""


# -- what a question ends with -----------------------------------------------------------------


@dataclass
class RunResult:
    """What `Agent.run` and `Session.ask` return (a whole question's outcome; `Result` is one
    MIME output of a cell, as in E2B's SDK)."""

    answer: str | None  # None when the run stopped without one
    stop_reason: str  # agent.stops: answered, max_steps, repeated_action, model_error, ...
    detail: str = ""  # what fired, in words
    steps: int = 0  # model calls
    usage: Usage = field(default_factory=Usage)
    duration_s: float = 0.0
    error: str | None = None  # a model or sandbox error, worded for the user
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # host paths of the files the code wrote
    trace_path: Path | None = None
    notebook_path: Path | None = None
    checks: dict | None = None  # declared output checks: {"passed", "outputs": {path: ...}}

    @property
    def answered(self) -> bool:
        return self.answer is not None and self.stop_reason == "answered"

    def to_dict(self) -> dict:
        d = {k: v for k, v in vars(self).items() if k != "usage"}
        d.update(
            usage=vars(self.usage),
            trace_path=str(self.trace_path or ""),
            notebook_path=str(self.notebook_path or ""),
        )
        return d
