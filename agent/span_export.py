"""The exporting process of sandcell's traces (`python span_export.py SERVICE`, started by
agent/telemetry.py, one per process that traces; run as a script, it imports the SDK and no
sandcell code): it reads batches of span records (telemetry.SpanRecord's fields, as tuples)
on its stdin, makes each the SDK's span and hands it to the SDK's batch processor and
exporter, as this process's own OTEL_* variables configure them (OTLP over HTTP, or the
console, which writes to stderr). A batch that asks to be flushed is exported before one byte
answers it on the stdout it was given. When stdin ends (or breaks: its writer was killed) it
exports what it holds, for a few seconds at most, and ends.

The SDK's warnings (a collector down, a batch refused) reach stderr as one `sandcell: traces:`
line, no traceback, at most one a minute: a trace is never worth a flood on the terminal."""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

WARN_EVERY_S = 60.0
LAST_EXPORT_S = 3.0  # at the end, a collector that is slow or down gets this long
FLUSH_S = 10.0  # ... and a flush asked for (the SDK's own flush does not time out)
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


def _span(record: tuple, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id, span_id, parent_id, remote_parent, name, client, start, end, attributes, error = (
        record
    )
    parent = None
    if parent_id is not None:
        parent = SpanContext(trace_id, parent_id, remote_parent, SAMPLED)
    status = OK if error is None else Status(StatusCode.ERROR, error or None)
    return ReadableSpan(
        name,
        context=SpanContext(trace_id, span_id, False, SAMPLED),
        parent=parent,
        resource=resource,
        attributes=attributes,
        kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


def main(service: str) -> None:
    answers = os.fdopen(os.dup(1), "wb")  # the flush answers; whatever else writes to
    os.dup2(2, 1)  # stdout (the console exporter) goes to stderr
    _say_warnings()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service})
    processor = BatchSpanProcessor(_exporter())
    scope = InstrumentationScope(service)
    stdin = sys.stdin.buffer
    while True:
        try:
            records, flush = pickle.load(stdin)  # from the process that started this one
        except Exception:  # EOFError: its end; another: cut short, its writer killed mid-batch
            break
        for record in records:
            processor.on_end(_span(record, resource, scope))
        if flush:
            _flush_within(processor, FLUSH_S)
            try:
                answers.write(b".")
                answers.flush()
            except OSError:  # the asker is gone: this process ends with its stdin
                pass
    _flush_within(processor, LAST_EXPORT_S)
    os._exit(0)  # not waiting any longer for an export under way (the SDK's exit would)


def _flush_within(processor: BatchSpanProcessor, seconds: float) -> None:
    flushing = threading.Thread(target=processor.force_flush, daemon=True)
    flushing.start()
    flushing.join(seconds)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sandcell")
