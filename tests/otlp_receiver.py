"""An OTLP/HTTP receiver for the trace tests, as the scripted server stands for a model
endpoint: it takes the real exporter's POST /v1/traces (protobuf, gzip when sent so), decodes
it with opentelemetry-proto and keeps each span as a plain dict."""

from __future__ import annotations

import gzip
import http.server
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(any_value) -> object:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class Receiver(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[dict] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def named(self, prefix: str) -> list[dict]:
        with self.lock:
            return [s for s in self.spans if s["name"].startswith(prefix)]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        spans = [
            {
                "name": span.name,
                "trace_id": span.trace_id.hex(),
                "span_id": span.span_id.hex(),
                "parent": span.parent_span_id.hex(),
                "start": span.start_time_unix_nano,
                "end": span.end_time_unix_nano,
                "status": span.status.code,
                "status_message": span.status.message,
                "attributes": {a.key: _value(a.value) for a in span.attributes},
            }
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self.server.lock:
            self.server.spans += spans
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        yield receiver
    finally:
        receiver.shutdown()
        receiver.server_close()


@contextmanager
def receiving_apart() -> Iterator[tuple[str, dict[str, int]]]:
    """A receiver in a process of its own, as a collector is (a bench: its decoding is not
    this process's cost): its endpoint, and once the block ends, the spans it got by name."""
    command = [sys.executable, "-m", "tests.otlp_receiver"]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    counts: dict[str, int] = {}
    try:
        yield process.stdout.readline().strip(), counts
    finally:
        process.stdin.close()
        counts.update(json.loads(process.stdout.readline() or "{}"))
        process.wait(10)


def main() -> None:
    """Say the endpoint; when stdin ends, the spans received by name (JSON), and end."""
    with receiving() as receiver:
        print(receiver.endpoint, flush=True)
        sys.stdin.read()
        with receiver.lock:
            print(json.dumps(Counter(s["name"] for s in receiver.spans)), flush=True)


if __name__ == "__main__":
    main()
