"""OpenTelemetry traces of questions, in the GenAI semantic conventions' shape: a subscriber of
the typed event stream (as the trace file, the console and the metrics are), on only when the
standard variables ask for it (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_EXPORTER`); off,
nothing here runs and the SDK is never imported. One trace per question:

    invoke_agent sandcell           gen_ai.conversation.id: the session's folder name
      chat {model}                  one per model request, retries their own
      execute_tool {name}           one per tool call, with the cell's outcome
      sandbox start|pause|resume    as they happen

A batch job's question is a child of the driver's `sandcell batch job` span, wherever it ran:
only its W3C `traceparent` travels with the job (`begin_job`).

Prompts, code and outputs go into spans only with
`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`; otherwise only names, counts,
durations and outcomes do.

Where the work is done: the SDK takes ~40 µs of Python to make a span and as much to export
it, as long as a whole loop step around an instant tool. So the loop's thread only stamps each
event with the time and queues it; a thread makes finished span records (ids made here, so a
job's traceparent is known before any of its spans is exported) and pipes them in batches to
an exporting process of the SDK (agent/span_export.py, one per process that traces), which
runs with this process's OTEL_* variables and ends, exporting what it holds, when its pipe
does."""

from __future__ import annotations

import atexit
import datetime as dt
import importlib.util
import json
import logging
import os
import pickle
import queue
import random
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

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
SEND_S = 0.2  # events are made into spans and piped this often
DRAIN_S = 5.0  # at most this long for the queued spans to reach the exporter (flush, exit)
MAX_PENDING = 100_000  # events waiting to be made into spans, at most (the host's memory)
CLOSE_WAIT_S = 2.0  # ... and for it to export them and end, at exit
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
ERROR = ""  # a SpanRecord's error when it failed without a description


def enabled(env: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether the standard variables ask for traces."""
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return bool(exporter) or any(env.get(name) for name in endpoints)


class SpanRecord(NamedTuple):
    """A finished span, as the exporting process makes it into the SDK's."""

    trace_id: int
    span_id: int
    parent_id: int | None
    remote_parent: bool  # the parent span was made in another process (a batch's driver)
    name: str
    client: bool  # a call out of the process (a model request): SpanKind CLIENT
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: str | None  # the status's description when it failed (ERROR: none given)
    # piped as a plain tuple in this order: span_export.py reads it so, importing no sandcell


@dataclass
class Begun:
    """A span begun and not yet ended."""

    trace_id: int
    span_id: int
    parent_id: int | None
    remote_parent: bool
    name: str
    start_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"

    def ended(self, end_ns: int, error: str | None = None, client: bool = False) -> SpanRecord:
        return SpanRecord(
            self.trace_id, self.span_id, self.parent_id, self.remote_parent, self.name,
            client, self.start_ns, end_ns, self.attributes, error,
        )  # fmt: skip


def begin(
    name: str,
    start_ns: int,
    parent: Begun | None = None,
    remote: tuple[int, int] | None = None,
    attributes: dict[str, Any] | None = None,
) -> Begun:
    """A span under `parent` (made here) or `remote` (trace and span id made elsewhere), else
    the root of a new trace."""
    span_id = random.getrandbits(64) or 1
    if parent is not None:
        trace_id, parent_id, is_remote = parent.trace_id, parent.span_id, False
    elif remote is not None:
        (trace_id, parent_id), is_remote = remote, True
    else:
        trace_id, parent_id, is_remote = random.getrandbits(128) or 1, None, False
    return Begun(trace_id, span_id, parent_id, is_remote, name, start_ns, attributes or {})


def parse_traceparent(text: str | None) -> tuple[int, int] | None:
    """(trace id, span id) of a W3C traceparent, None for none or a malformed one."""
    match = TRACEPARENT.fullmatch(text or "")
    if match is None:
        return None
    trace_id, span_id = int(match[1], 16), int(match[2], 16)
    return (trace_id, span_id) if trace_id and span_id else None


@dataclass
class Mark:
    """In the exporter's queue: everything before it piped (and exported: `export`), then
    `done` set; `close`: the pipe closed after it, and nothing more is sent."""

    done: threading.Event = field(default_factory=threading.Event)
    export: bool = False
    close: bool = False


class Exporter:
    """This process's way to its exporting process: events queued by the loops' threads, made
    into span records by one thread, piped in batches."""

    def __init__(self) -> None:
        self.pending: queue.SimpleQueue = queue.SimpleQueue()
        # run as a script, not a module of the package: it imports the SDK and nothing else
        script = str(Path(__file__).with_name("span_export.py"))
        # its own session: a Ctrl-C meant for this process does not cut its last export short;
        # it ends when its stdin does, whenever this process ends
        self.process = subprocess.Popen(
            [sys.executable, script, AGENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.broken = False
        threading.Thread(target=self._send, name="sandcell-spans", daemon=True).start()

    def queue(self, spans: Spans, ns: int, event: Event) -> None:
        if self.pending.qsize() < MAX_PENDING:  # else its pipe is stuck: the span is lost
            self.pending.put((spans, ns, event))

    def records(self, made: list[SpanRecord]) -> None:
        """Span records made elsewhere (a batch job's), piped in order with the rest."""
        self.pending.put((None, 0, made))

    def flush(self) -> None:
        """Wait until what was queued so far was exported."""
        mark = Mark(export=True)
        self.pending.put((None, 0, mark))
        mark.done.wait(2 * DRAIN_S)

    def close(self) -> None:
        """The queued spans piped, the pipe closed: the process exports them and ends (a
        collector that is slow or down holds it a few seconds, not this process)."""
        mark = Mark(close=True)
        self.pending.put((None, 0, mark))
        if mark.done.wait(DRAIN_S):
            try:
                self.process.wait(CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                pass

    def _send(self) -> None:
        while True:
            first = self.pending.get()
            # then what comes within SEND_S: a wake and a write per batch, not per event
            # (each costs the loop's thread more than its event's span)
            time.sleep(SEND_S)
            if self._send_batch(first):
                return

    def _send_batch(self, item: tuple) -> bool:
        """Everything queued, piped; True once the pipe is closed."""
        records: list[SpanRecord] = []
        while True:
            spans, ns, event = item
            if isinstance(event, Mark):
                self._write(records, flush=event.export)
                records = []
                if event.close:
                    self._close_pipe()
                event.done.set()
                if event.close:
                    return True
            else:
                records += event if spans is None else spans.made(ns, event)
            try:
                item = self.pending.get_nowait()
            except queue.Empty:
                break
        self._write(records)
        return False

    def _write(self, records: list[SpanRecord], flush: bool = False) -> None:
        if self.broken or not (records or flush):
            return
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            sent = ([tuple(record) for record in records], flush)  # plain: no class to import
            pickle.dump(sent, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
            if flush and self.process.stdout.read(1) != b".":
                raise OSError("it did not say the spans were exported")
        except Exception as error:  # the process ended (or worse): said once, spans dropped
            self.broken = True
            log.warning("traces are not exported any more: their process ended (%s)", error)

    def _close_pipe(self) -> None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass


_exporter_lock = threading.Lock()
_exporter: Exporter | None = None  # the process's, made once
_cannot = False  # ... or said once that it cannot be


def the_exporter() -> Exporter | None:
    """The process's exporter (started once), or None without the SDK (said once)."""
    global _exporter, _cannot
    with _exporter_lock:
        if _exporter is None and not _cannot:
            needed = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
            if all(importlib.util.find_spec(name) for name in needed):
                _say_unsupported()
                try:
                    _exporter = Exporter()
                except OSError as error:  # no process to be had: the questions go on
                    log.warning("traces are not exported: %s", error)
                    _cannot = True
            else:
                log.warning("OTEL_* asks for traces; install sandcell[otel] for them")
                _cannot = True
        return _exporter


def _say_unsupported() -> None:
    """What sandcell's exporting process does not do, said once: it exports OTLP over HTTP
    (protobuf) or to the console."""
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", ""
    )
    if protocol and protocol != "http/protobuf":
        log.warning(
            "traces go as OTLP http/protobuf; OTEL_EXPORTER_OTLP_PROTOCOL=%s is not used", protocol
        )
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter not in ("otlp", "console", ""):
        log.warning("traces go to otlp or console; OTEL_TRACES_EXPORTER=%s: otlp is used", exporter)


def close() -> None:
    """This process's exporter closed (at exit; a Ray node's runner as it closes): what it
    has is exported, and the next trace starts another."""
    global _exporter
    with _exporter_lock:
        exporter, _exporter = _exporter, None
    if exporter is not None:
        exporter.close()


atexit.register(close)  # once: a process's exporter, whichever it has then, ends with it


def flush() -> None:
    """The spans of the events published so far, exported now (the exporter's process also
    exports as it goes and as it ends)."""
    exporter = _exporter  # once: a close() may take it meanwhile
    if exporter is not None:
        exporter.flush()


def spans_for(conversation: str, parent: str | None = None) -> OnEvent | None:
    """A session's span writer, or None when traces are off. `parent`: the traceparent its
    questions belong under (a batch job's)."""
    if not enabled():
        return None
    exporter = the_exporter()
    return None if exporter is None else Spans(exporter, conversation, parent).on_event


def begin_job(job_id: str) -> Begun | None:
    """A batch job's span on the driver (None when traces are off), begun as the job is sent
    to run wherever it runs; its traceparent is all that travels with it."""
    if not enabled() or the_exporter() is None:
        return None
    attributes = {"sandcell.job.id": job_id, "gen_ai.conversation.id": job_id}
    return begin(f"{AGENT} batch job", time.time_ns(), attributes=attributes)


def traceparent(span: Begun | None) -> str | None:
    return None if span is None else span.traceparent


def end_job(span: Begun | None, status: str, error: str | None = None) -> None:
    """The job's span ended as its results line is written (`status` its status; `error`:
    it failed, or was stopped)."""
    exporter = the_exporter() if span is not None else None
    if span is None or exporter is None:
        return
    span.attributes["sandcell.job.status"] = status
    exporter.records([span.ended(time.time_ns(), error)])


def end_record(span: Begun | None, record: dict[str, Any]) -> None:
    """end_job for a job's line of results.jsonl."""
    status = str(record.get("status"))
    end_job(span, status, str(record.get("error") or ERROR) if status == "failed" else None)


class JobSpans:
    """A batch driver's job spans (threads or Ray): one a job over its parkings, begun as it
    is first sent, ended as its results line is written, or as the batch stops."""

    def __init__(self) -> None:
        self._spans: dict[str, Begun | None] = {}  # the jobs sent, not yet recorded

    def traceparent(self, job_id: str) -> str | None:
        """What travels with the job (None when traces are off)."""
        if job_id not in self._spans:
            self._spans[job_id] = begin_job(job_id)
        return traceparent(self._spans[job_id])

    def recorded(self, job_id: str, record: dict[str, Any]) -> None:
        end_record(self._spans.pop(job_id, None), record)

    def stopped(self, reason: str) -> None:
        """The jobs sent and not recorded (parked, cut short): a rerun runs them."""
        for span in self._spans.values():
            end_job(span, reason, reason)
        self._spans.clear()


class Spans:
    """The spans of one session, from its events (one question at a time, as the loop runs).
    `on_event` runs in the loop's thread; the rest in the exporter's."""

    def __init__(self, exporter: Exporter, conversation: str, parent: str | None = None):
        self.exporter, self.conversation = exporter, conversation
        self.parent = parse_traceparent(parent)
        self.capture = os.environ.get(CAPTURE_ENV, "").lower() == "true"
        self.model = ""
        self.agent: Begun | None = None  # the question's invoke_agent span, while it runs
        self.tools: list[Begun] = []  # execute_tool spans begun, not yet observed

    def on_event(self, event: Event) -> None:
        self.exporter.queue(self, time.time_ns(), event)

    def made(self, ns: int, event: Event) -> list[SpanRecord]:
        """The spans `event`, published at `ns`, ends."""
        try:
            return self._on(ns, event)
        except Exception:  # a span is never worth a question
            log.debug("a span was not made for %s", type(event).__name__, exc_info=True)
            return []

    def _on(self, ns: int, event: Event) -> list[SpanRecord]:
        match event:
            case SessionStarted():
                self.model = event.model
            case Question():
                self._question(ns, event)
            case ModelRequest():
                return [self._chat(event)]
            case ActionStarted():
                self._tool_begun(ns, event)
            case Observation():
                return self._tool_ended(ns, event)
            case Final():
                return self._answered(ns, event)
            case SandboxReady(used=None) | SandboxStartFailed():
                began = _iso(event.started_at)
                return [self._sandbox(ns, "start", event.start_s, began, _error(event))]
            case SandboxPaused():
                return [self._sandbox(ns, "pause", event.seconds, None, None)]
            case SandboxResumed():
                return [self._sandbox(ns, "resume", event.seconds, None, event.error)]
        return []

    def _child(self, name: str, start_ns: int, attributes: dict[str, Any]) -> Begun:
        """A span of the question running, else of the session's parent (a batch job's: a
        job a recipe solved asks no question), else of a trace of its own."""
        return begin(name, start_ns, self.agent, self.parent, attributes)

    def _question(self, ns: int, event: Question) -> None:
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT,
            "gen_ai.conversation.id": self.conversation,
            "gen_ai.request.model": self.model,
        }
        if self.capture:
            message = [{"role": "user", "parts": [{"type": "text", "content": event.task}]}]
            attributes["gen_ai.input.messages"] = _cut(json.dumps(message))
        self.agent = begin(f"invoke_agent {AGENT}", ns, None, self.parent, attributes)

    def _chat(self, event: ModelRequest) -> SpanRecord:
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
        sent = int(event.sent * 1e9)
        span = self._child(f"chat {event.model}", sent, attributes)
        return span.ended(sent + int(event.duration_s * 1e9), event.error, client=True)

    def _tool_begun(self, ns: int, event: ActionStarted) -> None:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": event.tool}
        if event.call_id:
            attributes["gen_ai.tool.call.id"] = event.call_id
        if self.capture:
            arguments = event.args if isinstance(event.args, str) else json.dumps(event.args)
            attributes["gen_ai.tool.call.arguments"] = _cut(arguments)
        self.tools.append(self._child(f"execute_tool {event.tool}", ns, attributes))

    def _tool_ended(self, ns: int, event: Observation) -> list[SpanRecord]:
        if not self.tools:
            return []
        span = self.tools.pop(0)
        if event.execution is not None:
            from sandcell.agent.metrics import cell_outcome

            span.attributes["sandcell.cell.outcome"] = cell_outcome(event.execution)
        if not event.ok:
            span.attributes["error.type"] = "tool_error"
        if self.capture:
            span.attributes["gen_ai.tool.call.result"] = _cut(event.text)
        return [span.ended(ns, None if event.ok else ERROR)]

    def _answered(self, ns: int, event: Final) -> list[SpanRecord]:
        made = []
        for span in self.tools:  # begun, never observed: the question stopped under it
            span.attributes["error.type"] = event.stop_reason
            made.append(span.ended(ns, ERROR))
        self.tools = []
        if self.agent is None:
            return made
        error = None
        if event.answer is None:  # its detail may quote code or output: only with capture
            self.agent.attributes["error.type"] = event.stop_reason
            error = _cut(event.detail) if self.capture else ERROR
        elif self.capture:
            message = [{"role": "assistant", "parts": [{"type": "text", "content": event.answer}]}]
            self.agent.attributes["gen_ai.output.messages"] = _cut(json.dumps(message))
        made.append(self.agent.ended(ns, error))
        self.agent = None
        return made

    def _sandbox(
        self, ns: int, what: str, seconds: float | None, began: float | None, error: str | None
    ) -> SpanRecord:
        start = began if began is not None else ns / 1e9 - (seconds or 0.0)
        end = int((start + seconds) * 1e9) if seconds is not None else ns
        attributes = {"error.type": "sandbox_error"} if error else {}
        span = self._child(f"sandbox {what}", int(start * 1e9), attributes)
        return span.ended(end, error[:200] if error else None)


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
