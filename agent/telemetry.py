"""OpenTelemetry traces of questions, in the GenAI semantic conventions' shape: a subscriber of
the typed event stream (as the trace file, the console and the metrics are), on only when the
standard variables ask for it (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_EXPORTER`); off, the
SDK is never imported. One trace per question:

    invoke_agent sandcell           gen_ai.conversation.id: the session's folder name
      chat {model}                  one per model request, retries their own
      execute_tool {name}           one per tool call, with the cell's outcome
      sandbox start|pause|resume    as they happen

Prompts, code and outputs go into spans only with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`; otherwise only names, counts,
durations and outcomes do."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from typing import Any

from sandcell.agent.events import (
    ActionStarted,
    Event,
    Final,
    ModelRequest,
    Observation,
    OnEvent,
    Question,
    SandboxPaused,
    SandboxReady,
    SandboxResumed,
    SandboxStartFailed,
    SessionStarted,
)

log = logging.getLogger(__name__)
AGENT = "sandcell"
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
CONTENT_CHARS = 8000  # a captured prompt, argument or result, cut to this
_provider_lock = threading.Lock()
_tracer: Any = None  # the process's, made once
_provider: Any = None  # ... and its provider (flush)


def enabled(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether the standard variables ask for traces."""
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return bool(exporter) or any(env.get(name) for name in endpoints)


def spans_for(conversation: str) -> OnEvent | None:
    """A session's span writer, or None when traces are off (or the SDK is not installed:
    said once, and the session runs on without)."""
    if not enabled():
        return None
    tracer = the_tracer()
    return None if tracer is None else Spans(tracer, conversation).on_event


def the_tracer() -> Any:
    """The process's tracer (made once, from OTEL_*), or None without the SDK."""
    global _tracer
    with _provider_lock:
        if _tracer is None:
            try:
                _tracer = _make_tracer()
            except ImportError as error:
                log.warning(
                    "OTEL_* asks for traces, but %s; install sandcell[otel] for them", error
                )
                _tracer = False
        return _tracer or None


def _make_tracer() -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    exporter: Any
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:  # otlp: over HTTP (protobuf), where OTEL_EXPORTER_OTLP_* point, with their headers
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    service = os.environ.get("OTEL_SERVICE_NAME") or AGENT
    global _provider
    _provider = TracerProvider(resource=Resource.create({"service.name": service}))
    _provider.add_span_processor(BatchSpanProcessor(exporter))  # flushed at exit by the SDK
    return _provider.get_tracer("sandcell")


def flush() -> None:
    """The spans made so far, exported now (a bench's round; the SDK flushes at exit)."""
    if _provider is not None:
        _provider.force_flush()


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class Spans:
    """The spans of one session, from its events (one question at a time, as the loop runs)."""

    def __init__(self, tracer: Any, conversation: str):
        from opentelemetry import trace

        self.tracer, self.trace, self.conversation = tracer, trace, conversation
        self.capture = os.environ.get(CAPTURE_ENV, "").lower() == "true"
        self.model = ""
        self.agent: Any = None  # the question's invoke_agent span, while it runs
        self.tools: list[Any] = []  # execute_tool spans begun, not yet observed

    def on_event(self, event: Event) -> None:
        try:
            self._on(event)
        except Exception:  # a span is never worth a question
            log.debug("a span was not made for %s", type(event).__name__, exc_info=True)

    def _on(self, event: Event) -> None:
        match event:
            case SessionStarted():
                self.model = event.model
            case Question():
                self._question(event)
            case ModelRequest():
                self._chat(event)
            case ActionStarted():
                self._tool_begun(event)
            case Observation():
                self._tool_ended(event)
            case Final():
                self._answered(event)
            case SandboxReady(used=None) | SandboxStartFailed():
                self._sandbox("start", event.start_s, _iso(event.started_at), _error(event))
            case SandboxPaused():
                self._sandbox("pause", event.seconds, None, None)
            case SandboxResumed():
                self._sandbox("resume", event.seconds, None, event.error)

    def _context(self) -> Any:
        return self.trace.set_span_in_context(self.agent) if self.agent is not None else None

    def _question(self, event: Question) -> None:
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT,
            "gen_ai.conversation.id": self.conversation,
            "gen_ai.request.model": self.model,
        }
        if self.capture:
            message = [{"role": "user", "parts": [{"type": "text", "content": event.task}]}]
            attributes["gen_ai.input.messages"] = _cut(json.dumps(message))
        self.agent = self.tracer.start_span(f"invoke_agent {AGENT}", attributes=attributes)

    def _chat(self, event: ModelRequest) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": event.model,
            "sandcell.attempt": event.attempt,
        }
        if event.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = event.input_tokens
            attributes["gen_ai.usage.output_tokens"] = event.output_tokens or 0
        if event.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [event.finish_reason]
        if event.error:
            attributes["error.type"] = event.error
        span = self.tracer.start_span(
            f"chat {event.model}",
            context=self._context(),
            kind=self.trace.SpanKind.CLIENT,
            attributes=attributes,
            start_time=_ns(event.sent),
        )
        if event.error:
            span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, event.error))
        span.end(end_time=_ns(event.sent + event.duration_s))

    def _tool_begun(self, event: ActionStarted) -> None:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.tool}
        if event.call_id:
            attributes["gen_ai.tool.call.id"] = event.call_id
        if self.capture:
            arguments = event.args if isinstance(event.args, str) else json.dumps(event.args)
            attributes["gen_ai.tool.call.arguments"] = _cut(arguments)
        name = f"execute_tool {event.tool}"
        self.tools.append(
            self.tracer.start_span(name, context=self._context(), attributes=attributes)
        )

    def _tool_ended(self, event: Observation) -> None:
        if not self.tools:
            return
        span = self.tools.pop(0)
        if event.execution is not None:
            from sandcell.agent.metrics import cell_outcome

            span.set_attribute("sandcell.cell.outcome", cell_outcome(event.execution))
        if not event.ok:
            span.set_attribute("error.type", "tool_error")
            span.set_status(self.trace.Status(self.trace.StatusCode.ERROR))
        if self.capture:
            span.set_attribute("gen_ai.tool.call.result", _cut(event.text))
        span.end()

    def _answered(self, event: Final) -> None:
        for span in self.tools:  # begun and never observed (a stop between them)
            span.end()
        self.tools = []
        if self.agent is None:
            return
        if event.answer is None:
            self.agent.set_attribute("error.type", event.stop_reason)
            self.agent.set_status(self.trace.Status(self.trace.StatusCode.ERROR, event.detail))
        elif self.capture:
            message = [{"role": "assistant", "parts": [{"type": "text", "content": event.answer}]}]
            self.agent.set_attribute("gen_ai.output.messages", _cut(json.dumps(message)))
        self.agent.end()
        self.agent = None

    def _sandbox(
        self, what: str, seconds: float | None, began: float | None, error: str | None
    ) -> None:
        end = time.time()
        start = began if began is not None else end - (seconds or 0.0)
        span = self.tracer.start_span(
            f"sandbox {what}", context=self._context(), start_time=_ns(start)
        )
        if error:
            span.set_attribute("error.type", "sandbox_error")
            span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, error[:200]))
        span.end(end_time=_ns(start + seconds if seconds is not None else end))


def _error(event: SandboxReady | SandboxStartFailed) -> str | None:
    return event.error if isinstance(event, SandboxStartFailed) else None


def _iso(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _cut(text: str) -> str:
    return text if len(text) <= CONTENT_CHARS else text[:CONTENT_CHARS] + "…"
