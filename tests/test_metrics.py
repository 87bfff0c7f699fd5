"""agent.metrics without a server: every fixed series exists at start, the events a session
publishes (or a trace holds) are counted as the issue names them, and a batch's metrics.prom
is the textfile collector's format. The scrape of a real server: tests/test_metrics_serve.py."""

from importlib.metadata import version

from prometheus_client.parser import text_string_to_metric_families

from sandcell.agent.events import (
    ModelRequest,
    NetConnection,
    Rebuilt,
    SandboxPaused,
    SandboxReady,
    SandboxResumed,
    SandboxStartFailed,
    executed_cell,
)
from sandcell.agent.metrics import Metrics, cell_outcome
from sandcell.sandbox import Execution
from sandcell.sandbox.execution import ExecutionError


def samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of the registry's text, as a scrape parses it."""
    parsed = text_string_to_metric_families(metrics.text().decode())
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parsed
        for s in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, tuple(sorted(labels.items())))]


def test_every_series_of_a_fixed_label_set_is_there_before_any_event():
    fresh = samples(Metrics("runsc"))
    names = {name for name, _ in fresh}
    for family in (
        "sandcell_cell_duration_seconds_count", "sandcell_model_request_duration_seconds_count",
        "sandcell_model_tokens_total", "sandcell_rejections_total", "sandcell_kernel_restarts_total",
        "sandcell_sandbox_start_duration_seconds_count", "sandcell_pause_duration_seconds_count",
        "sandcell_resume_duration_seconds_count", "sandcell_net_connections_total",
        "sandcell_build_info",
    ):  # fmt: skip
        assert family in names, family
    cells = {
        dict(labels)["outcome"]
        for name, labels in fresh
        if name == "sandcell_cell_duration_seconds_count"
    }
    assert cells == {"ok", "error", "timeout", "interrupted", "restarted"}
    reasons = {
        dict(labels)["reason"] for name, labels in fresh if name == "sandcell_rejections_total"
    }
    assert reasons == {"capacity", "per_user", "quota", "auth"}
    restarts = {
        dict(labels)["reason"] for name, labels in fresh if name == "sandcell_kernel_restarts_total"
    }
    assert restarts == {"timeout", "out_of_memory", "died"}
    starts = {
        tuple(sorted(dict(labels).items()))
        for name, labels in fresh
        if name == "sandcell_sandbox_start_duration_seconds_count"
    }
    assert (("outcome", "error"), ("runtime", "runsc")) in starts and len(starts) == 8
    assert all(v == 0 for (name, _), v in fresh.items() if name.endswith(("_count", "_total")))


def test_a_cell_s_outcome_goes_by_precedence():
    error = ExecutionError("ValueError", "bad", [])
    assert cell_outcome(Execution("x")) == "ok"
    assert cell_outcome(Execution("x", error=error)) == "error"
    assert cell_outcome(Execution("x", error=error, interrupted=True)) == "interrupted"
    assert cell_outcome(Execution("x", interrupted=True, restarted="died")) == "restarted"
    assert cell_outcome(Execution("x", timed_out=True, restarted="timeout")) == "timeout"


def test_events_are_counted_as_they_come():
    metrics = Metrics("runc")
    timed_out = Execution("while True: pass", timed_out=True, restarted="timeout", duration_s=3.2)
    for event in [
        executed_cell(1, "1", Execution("1", duration_s=0.01)),
        executed_cell(1, "loop", timed_out),
        executed_cell(1, "oom", Execution("x", restarted="out of memory", duration_s=1.0)),
        ModelRequest(model="m", sent=0, duration_s=0.5, input_tokens=100, output_tokens=20),
        ModelRequest(model="m", sent=0, duration_s=0.1, attempt=0, error="429"),
        ModelRequest(model="m", sent=0, duration_s=0.2, attempt=1, error="cancelled"),  # a Stop
        SandboxReady(started_at=None, start_s=0.8, waited_s=0.0),
        SandboxReady(started_at=None, start_s=0.8, waited_s=0.0, used=False),  # its close: not again
        SandboxStartFailed(started_at=None, start_s=0.2, waited_s=0.2, error="no image"),
        SandboxPaused(reason="idle", seconds=1.5, size=10),
        SandboxResumed(seconds=0.7),
        SandboxResumed(seconds=0.1, error="the checkpoint is gone"),  # then a replay, counted so
        Rebuilt(cells=3, skipped=0, reason="restart", seconds=2.0),
        NetConnection(host="a.org", port=443, allowed=True),
        NetConnection(host="b.org", port=443, allowed=False),
    ]:  # fmt: skip
        metrics.observe(event)
    count = "sandcell_cell_duration_seconds_count"
    assert [value(metrics, count, outcome=o) for o in ("ok", "timeout", "restarted")] == [1, 1, 1]
    assert value(metrics, "sandcell_kernel_restarts_total", reason="timeout") == 1
    assert value(metrics, "sandcell_kernel_restarts_total", reason="out_of_memory") == 1
    requests = "sandcell_model_request_duration_seconds_count"
    assert [value(metrics, requests, outcome=o) for o in ("ok", "error", "cancelled")] == [1, 1, 1]
    assert value(metrics, "sandcell_model_tokens_total", direction="input") == 100
    assert value(metrics, "sandcell_model_tokens_total", direction="output") == 20
    starts = "sandcell_sandbox_start_duration_seconds_count"
    assert value(metrics, starts, runtime="runc", outcome="ok") == 1
    assert value(metrics, starts, runtime="runc", outcome="error") == 1
    assert value(metrics, "sandcell_pause_duration_seconds_count") == 1
    resumes = "sandcell_resume_duration_seconds_count"
    assert [value(metrics, resumes, outcome=o) for o in ("restored", "replayed")] == [1, 1]
    assert value(metrics, "sandcell_net_connections_total", outcome="refused") == 1
    assert value(metrics, "sandcell_cell_duration_seconds_sum", outcome="timeout") == 3.2


def test_requests_rejections_and_gauges_read_when_scraped(tmp_path):
    metrics = Metrics()
    metrics.request("POST", "/api/sessions", 503, 0.01, "capacity")
    metrics.request("GET", "/metrics", 401, 0.001, "auth")
    metrics.request("GET", "/api/sessions/{sid}", 200, 0.002, None)
    live = {"live": 2, "paused": 1, "released": 0}
    metrics.gauge("sandcell_sessions", "sessions by state", lambda: live, "state")
    assert value(metrics, "sandcell_rejections_total", reason="capacity") == 1
    assert value(metrics, "sandcell_rejections_total", reason="auth") == 1
    assert value(metrics, "sandcell_sessions", state="live") == 2
    live["live"] = 0  # read at each scrape
    assert value(metrics, "sandcell_sessions", state="live") == 0
    route = "sandcell_http_request_duration_seconds_count"
    assert value(metrics, route, method="GET", route="/api/sessions/{sid}", code="200") == 1
    assert value(metrics, "sandcell_build_info", version=version("sandcell")) == 1
    metrics.write(tmp_path / "metrics.prom")
    written = (tmp_path / "metrics.prom").read_text()
    assert 'sandcell_rejections_total{reason="capacity"} 1.0' in written


def test_the_middleware_counts_by_template_and_the_guard_s_refusals_are_auth():
    """Without a server process: a Starlette app with the guard and the middleware as serve
    stacks them; a refused scrape is /metrics' (matched before routing), an unknown path and
    an unknown method are "other"; --metrics-public opens /metrics alone."""
    import click
    import pytest
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from sandcell.agent.hosting.guard import Guard, Hosts
    from sandcell.agent.hosting.http_metrics import HttpMetrics
    from sandcell.agent.hosting.server_options import check_metrics_public

    def app(public: bool) -> tuple[Starlette, Metrics]:
        metrics = Metrics()
        routes = [
            Route("/metrics", lambda r: PlainTextResponse(metrics.text())),
            Route("/api/sessions/{id}", lambda r: PlainTextResponse("x")),
        ]
        return Starlette(
            routes=routes,
            middleware=[
                Middleware(HttpMetrics, metrics=metrics, routes=routes),
                Middleware(
                    Guard,
                    hosts=Hosts("127.0.0.1", ()),
                    users={"a": "t" * 20},
                    metrics_public=public,
                ),
            ],
        ), metrics

    guarded, metrics = app(public=False)
    with TestClient(guarded, base_url="http://127.0.0.1") as client:
        assert client.get("/metrics").status_code == 401
        assert (
            client.get(
                "/api/sessions/5f1c9a7e", headers={"Authorization": "Bearer " + "t" * 20}
            ).status_code
            == 200
        )
        assert client.get("/nowhere/5f1c9a7e").status_code == 404
        assert client.request("BREW", "/metrics").status_code == 401
    count = "sandcell_http_request_duration_seconds_count"
    assert value(metrics, count, method="GET", route="/metrics", code="401") == 1
    assert value(metrics, count, method="GET", route="/api/sessions/{id}", code="200") == 1
    assert value(metrics, count, method="GET", route="other", code="404") == 1
    assert value(metrics, count, method="other", route="/metrics", code="401") == 1
    assert value(metrics, "sandcell_rejections_total", reason="auth") == 2
    assert not any("5f1c9a7e" in str(labels) for _, labels in samples(metrics))
    public, _ = app(public=True)
    with TestClient(public, base_url="http://127.0.0.1") as client:
        assert client.get("/metrics").status_code == 200
        assert client.get("/api/sessions/1").status_code == 401  # the API still takes a token
    check_metrics_public(True, "127.0.0.1", ())
    check_metrics_public(True, "::1", ())
    for host, allowed in [
        ("0.0.0.0", ()),
        ("10.1.2.3", ()),
        ("127.0.0.1", ("sandcell.example.org",)),
    ]:
        with pytest.raises(click.UsageError):
            check_metrics_public(True, host, allowed)
