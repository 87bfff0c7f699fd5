"""What an operator counts (Prometheus): the families of `sandcell serve`, `sandcell mcp --http`
and a batch's `metrics.prom`, kept from the typed event stream (`observe` is a subscriber, as
the trace and the console are) and, for HTTP, from one ASGI middleware (agent.hosting).

Label values are fixed sets, every series of a fixed set made at start (a query sees 0, not
nothing, before the first event). No user, session id, path or node is ever a label value:
those go to the logs and traces, never into a series of their own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import version
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    write_to_textfile,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sandcell.agent.events import (
    Event,
    ModelRequest,
    NetConnection,
    Rebuilt,
    SandboxPaused,
    SandboxReady,
    SandboxResumed,
    SandboxStartFailed,
    Step,
)
from sandcell.sandbox.execution import Execution

CELL_OUTCOMES = ("ok", "error", "interrupted", "restarted", "timeout")
RESTART_REASONS = {"timeout": "timeout", "out of memory": "out_of_memory", "died": "died"}
REJECTIONS = {401: "auth", 429: "per_user", 503: "capacity", 507: "quota"}
SESSION_STATES = ("live", "paused", "released")
RUNTIMES = ("default", "runc", "runsc", "other")
NET_OUTCOMES = ("allowed", "refused")
MODEL_OUTCOMES = ("ok", "error", "cancelled")
SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
REJECTION_KEY = "sandcell.rejection"  # an ASGI scope's: why a request was refused
Read = Callable[[], dict[str, int]]


class Metrics:
    """One server's (or one batch's) families, in a registry of their own."""

    def __init__(self, runtime: str | None = None):
        self.runtime = "default" if runtime is None else runtime if runtime in RUNTIMES else "other"
        self.registry = r = CollectorRegistry()
        Gauge("sandcell_build_info", "sandcell's version", ["version"], registry=r).labels(
            version("sandcell")
        ).set(1)
        self.http = Histogram(
            "sandcell_http_request_duration_seconds",
            "HTTP requests by method, route template and status code",
            ["method", "route", "code"],
            buckets=SECONDS,  # a message's stream and a long cell last minutes
            registry=r,
        )
        self.rejections = _counter(
            r, "sandcell_rejections", "requests refused", "reason", REJECTIONS.values()
        )
        self.starts = Histogram(
            "sandcell_sandbox_start_duration_seconds",
            "sandbox starts by runtime and outcome (ok, error)",
            ["runtime", "outcome"],
            buckets=SECONDS,
            registry=r,
        )
        _ = [self.starts.labels(name, out) for name in RUNTIMES for out in ("ok", "error")]
        self.cells = _histogram(
            r, "sandcell_cell_duration_seconds", "cells run by outcome", "outcome", CELL_OUTCOMES
        )
        self.model = _histogram(
            r,
            "sandcell_model_request_duration_seconds",
            "model requests (each retry one) by outcome (ok, error, cancelled: a Stop)",
            "outcome",
            MODEL_OUTCOMES,
        )
        self.tokens = _counter(
            r, "sandcell_model_tokens", "model tokens", "direction", ("input", "output")
        )
        self.pauses = Histogram(
            "sandcell_pause_duration_seconds", "sandboxes paused", buckets=SECONDS, registry=r
        )
        self.resumes = _histogram(
            r,
            "sandcell_resume_duration_seconds",
            "sandboxes brought back (restored from a pause, or rebuilt by replay)",
            "outcome",
            ("restored", "replayed"),
        )
        reasons = RESTART_REASONS.values()
        self.restarts = _counter(
            r, "sandcell_kernel_restarts", "kernels restarted", "reason", reasons
        )
        self.net = _counter(
            r, "sandcell_net_connections", "--allow-net connections", "outcome", NET_OUTCOMES
        )

    # -- the event stream ---------------------------------------------------------------
    def observe(self, event: Event) -> None:
        """A subscriber of agent.events: the facts that are counted."""
        match event:
            case Step():  # the agent's cells and /execute's, live or read back from a trace
                for ex in event.executions():
                    self.cells.labels(cell_outcome(ex)).observe(ex.duration_s)
                    if ex.restarted is not None:
                        reason = RESTART_REASONS.get(ex.restarted, "died")
                        self.restarts.labels(reason).inc()
            case ModelRequest():
                outcome = "ok" if event.error is None else event.error
                outcome = outcome if outcome in MODEL_OUTCOMES else "error"
                self.model.labels(outcome).observe(event.duration_s)
                self.tokens.labels("input").inc(event.input_tokens or 0)
                self.tokens.labels("output").inc(event.output_tokens or 0)
            case SandboxReady(start_s=float() as seconds, used=None):
                self.starts.labels(self.runtime, "ok").observe(seconds)
            case SandboxStartFailed():
                self.starts.labels(self.runtime, "error").observe(event.start_s or 0.0)
            case SandboxPaused():
                self.pauses.observe(event.seconds)
            case SandboxResumed(error=None):
                self.resumes.labels("restored").observe(event.seconds)
            case Rebuilt(seconds=float() as seconds):
                self.resumes.labels("replayed").observe(seconds)
            case NetConnection():
                self.net.labels("allowed" if event.allowed else "refused").inc()

    # -- HTTP ---------------------------------------------------------------------------
    def request(
        self, method: str, route: str, code: int, seconds: float, rejection: str | None
    ) -> None:
        """One HTTP request answered; `rejection` is REJECTIONS' reason where it was refused."""
        self.http.labels(method, route, str(code)).observe(seconds)
        if rejection in REJECTIONS.values():
            self.rejections.labels(rejection).inc()

    # -- out ----------------------------------------------------------------------------
    def gauge(self, name: str, help_text: str, read: Read, label: str | None = None) -> None:
        """A gauge read when scraped (sessions by state, a cluster's nodes and slots): `read`
        gives {label value: number}, every value of its fixed set there (no label: {"": n})."""
        self.registry.register(_Read(name, help_text, read, label))

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def write(self, path: Path) -> None:
        """The textfile collector's format (a batch's OUT/metrics.prom), replaced whole."""
        write_to_textfile(str(path), self.registry)


def cell_outcome(ex: Execution) -> str:
    """By precedence: timeout > restarted > interrupted > error > ok."""
    if ex.timed_out:
        return "timeout"
    if ex.restarted is not None:
        return "restarted"
    if ex.interrupted:
        return "interrupted"
    return "error" if ex.error is not None else "ok"


def _histogram(
    registry: CollectorRegistry, name: str, help_text: str, label: str, values: Iterable[str]
) -> Histogram:
    family = Histogram(name, help_text, [label], buckets=SECONDS, registry=registry)
    for value in values:
        family.labels(value)
    return family


def _counter(
    registry: CollectorRegistry, name: str, help_text: str, label: str, values: Iterable[str]
) -> Counter:
    family = Counter(name, help_text, [label], registry=registry)
    for value in values:
        family.labels(value)
    return family


class _Read(Collector):
    def __init__(self, name: str, help_text: str, read: Read, label: str | None):
        self.name, self.help_text, self.read, self.label = name, help_text, read, label

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = [self.label] if self.label else []
        family = GaugeMetricFamily(self.name, self.help_text, labels=labels)
        for value, number in self.read().items():
            family.add_metric([value] if self.label else [], number)
        yield family


def cluster_gauges(metrics: Metrics, pool: object) -> None:
    """serve --ray: the cluster's nodes offering slots, and its slots free and used (no node
    is a label: a count is what a dashboard wants, the node ids are in the logs). One look at
    the cluster per scrape, for both."""
    slots, held = getattr(pool, "slots", None), getattr(pool, "held", None)
    if slots is None or held is None:
        return
    seen: list = [0.0, {}, 0]  # when, the nodes' declared slots, the slots held

    def look() -> tuple[dict[str, int], int]:
        if time.monotonic() - seen[0] > 1.0:
            seen[:] = [time.monotonic(), slots(), sum(held().values())]
        return seen[1], seen[2]

    def nodes() -> dict[str, int]:
        return {"": len(look()[0])}

    def by_state() -> dict[str, int]:
        declared, used = look()
        return {"free": max(sum(declared.values()) - used, 0), "used": used}

    metrics.gauge("sandcell_nodes", "Ray nodes offering sandcell slots", nodes)
    metrics.gauge("sandcell_slots", "the cluster's sandcell slots by state", by_state, "state")
