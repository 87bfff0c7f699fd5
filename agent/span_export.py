"""The exporting process of sandcell's traces (`python -m sandcell.agent.span_export`, started
by agent/telemetry.py, one per process that traces): it reads batches of span records on its
stdin, makes each the SDK's span and hands it to the SDK's batch processor and exporter, as
this process's own OTEL_* variables configure them (OTLP over HTTP, or the console). A batch
that asks to be flushed is exported before one byte answers it on stdout. When stdin ends it
exports what it holds and ends.

The SDK's warnings (a collector down, a batch refused) reach stderr as one `sandcell: traces:`
line, no traceback, at most one a minute: a trace is never worth a flood on the terminal."""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from sandcell.agent.telemetry import AGENT, ERROR, SpanRecord

WARN_EVERY_S = 60.0
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
OK = Status(StatusCode.UNSET)


class Seldom(logging.Filter):
    """The first warning, then at most one each WARN_EVERY_S."""

    def __init__(self) -> None:
        super().__init__()
        self.said = -WARN_EVERY_S

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self.said < WARN_EVERY_S:
            return False
        self.said = now
        record.exc_info, record.exc_text = None, None  # the line, not its traceback
        return True


def _say_warnings() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("sandcell: traces: %(message)s"))
    handler.addFilter(Seldom())
    logger = logging.getLogger("opentelemetry")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.WARNING)


def _exporter() -> SpanExporter:
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        return ConsoleSpanExporter()
    # OTLP over HTTP (protobuf), where OTEL_EXPORTER_OTLP_* point, with their headers
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _span(record: SpanRecord, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    parent = None
    if record.parent_id is not None:
        parent = SpanContext(record.trace_id, record.parent_id, record.remote_parent, SAMPLED)
    status = OK if record.error is None else Status(StatusCode.ERROR, _said(record.error))
    return ReadableSpan(
        record.name,
        context=SpanContext(record.trace_id, record.span_id, False, SAMPLED),
        parent=parent,
        resource=resource,
        attributes=record.attributes,
        kind=SpanKind.CLIENT if record.client else SpanKind.INTERNAL,
        status=status,
        start_time=record.start_ns,
        end_time=record.end_ns,
        instrumentation_scope=scope,
    )


def _said(error: str) -> str | None:
    return None if error == ERROR else error


def main() -> None:
    _say_warnings()
    service = os.environ.get("OTEL_SERVICE_NAME") or AGENT
    resource = Resource.create({"service.name": service})
    scope = InstrumentationScope(AGENT)
    processor = BatchSpanProcessor(_exporter())
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            records, flush = pickle.load(stdin)  # from the process that started this one
        except EOFError:
            break
        for record in records:
            processor.on_end(_span(record, resource, scope))
        if flush:
            processor.force_flush()
            stdout.write(b".")
            stdout.flush()
    processor.shutdown()


if __name__ == "__main__":
    main()
