"""A real Prometheus (Debian's, started here on loopback with storage of its own) scrapes a
real `sandcell serve` with the API's token: after a scripted question, cells (one timing out)
and a session refused at capacity, PromQL through Prometheus' HTTP API returns the counts; no
label value holds a session id, a user or a path; /metrics without a token is refused."""

import signal
import subprocess

import httpx
import pytest

from tests.cli_runner import free_port
from tests.missing import cannot_run
from tests.polling import wait_for
from tests.serve_helpers import ALICE, client, execute, new_session, python, serve_process

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]
PROMETHEUS = "/usr/bin/prometheus"
CONFIG = """
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: sandcell
    authorization:
      credentials: {token}
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


@pytest.fixture
def prometheus(tmp_path):
    """Start one on a free port, scraping the port given to the returned function."""
    import shutil

    if shutil.which(PROMETHEUS) is None:
        cannot_run(f"{PROMETHEUS} is not installed (scripts/ensure-prometheus.sh)", "metrics test")
    started: list[subprocess.Popen] = []

    def start(target: int) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(CONFIG.format(token=ALICE, port=target))
        port = free_port()
        started.append(
            subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        )
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(base), 30, "prometheus ready")
        return base

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(base: str, promql: str) -> dict[str, float]:
    """An instant query's result: {the labels' values joined: value}."""
    got = httpx.get(f"{base}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert got["status"] == "success", got
    return {
        ",".join(r["metric"].get(k, "") for k in sorted(r["metric"])): float(r["value"][1])
        for r in got["data"]["result"]
    }


def test_prometheus_scrapes_the_server_s_counts_and_no_label_names_a_session(tmp_path, prometheus):
    replies = [python("print(6 * 7)"), "Final Answer: 42."]
    proc, base = serve_process(
        tmp_path, replies, "--pool", "0", "--max-sessions", "1", "--timeout", "3",
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        promql = prometheus(int(base.rsplit(":", 1)[1]))
        with client(base) as api, client(base, token=None) as anonymous:
            sid = new_session(api)
            with api.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "go"}) as r:
                r.read()
            assert execute(api, sid, "while True: pass").json()["timed_out"] is True
            assert api.post("/api/sessions").status_code == 503  # the one slot is taken
            assert anonymous.get("/metrics").status_code == 401
            capacity = 'sum(sandcell_rejections_total{reason="capacity"})'
            wait_for(lambda: query(promql, capacity) == {"": 1.0}, 60, "a scrape after them")
            seen = {
                name: query(promql, f"sum by (outcome) ({name})")
                for name in (
                    "sandcell_cell_duration_seconds_count",
                    "sandcell_model_request_duration_seconds_count",
                )
            }
            tokens = query(promql, "sum by (direction) (sandcell_model_tokens_total)")
            sessions = query(promql, "sum by (state) (sandcell_sessions)")
            auth = query(promql, 'sum(sandcell_rejections_total{reason="auth"})')
            series = httpx.get(
                f"{promql}/api/v1/series", params={"match[]": '{__name__=~"sandcell_.*"}'}
            ).json()["data"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    cells = seen["sandcell_cell_duration_seconds_count"]
    assert (cells["ok"], cells["timeout"], cells["error"]) == (1, 1, 0), cells
    assert seen["sandcell_model_request_duration_seconds_count"] == {
        "ok": 2, "error": 0, "cancelled": 0
    }  # fmt: skip
    assert tokens["input"] > 0 and tokens["output"] > 0, tokens
    assert sessions == {"live": 1, "paused": 0, "released": 0}, sessions
    assert auth == {"": 1}, auth
    values = {v for labels in series for k, v in labels.items() if k not in ("__name__", "job")}
    for secret in (sid, "alice", ALICE, str(tmp_path)):
        assert not any(secret in v for v in values), (secret, sorted(values))
    routes = {labels["route"] for labels in series if "route" in labels}
    assert routes == {
        "/api/sessions", "/api/sessions/{id}/messages", "/api/sessions/{id}/execute", "/metrics"
    }  # the refused scrape is /metrics' too  # fmt: skip


def test_metrics_without_a_token_only_on_loopback_and_only_when_asked(tmp_path):
    proc, base = serve_process(tmp_path, ["Final Answer: x."], "--pool", "0", "--metrics-public")
    try:
        opened = httpx.get(f"{base}/metrics", timeout=10)
        assert opened.status_code == 200 and "sandcell_build_info" in opened.text
        assert opened.headers["content-type"].startswith("text/plain; version=")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    from tests.cli_runner import sandcell

    refused = sandcell(
        "serve", "--host", "0.0.0.0", "--metrics-public", "--data", str(tmp_path / "d")
    )
    assert refused.returncode == 2, refused.stderr
    assert "--metrics-public needs a loopback --host (this one is 0.0.0.0)" in refused.stderr
