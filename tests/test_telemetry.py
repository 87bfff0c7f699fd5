"""OpenTelemetry traces (agent/telemetry.py): a real `sandcell run` against a scripted model
server exports through the real OTLP/HTTP exporter to a receiver in this test
(tests/otlp_receiver.py, decoding its protobuf): one trace per question, `invoke_agent`
its root, `chat {model}` per model request and `execute_tool {name}` per tool call under it,
the sandbox's start too; token counts as the trace file has them; no code or output in any
span unless OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT says so."""

import json
import os
import subprocess
import sys
import time

import pytest

from sandcell.agent import telemetry
from sandcell.agent.events import (
    ActionStarted,
    Final,
    ModelRequest,
    Observation,
    Question,
    SandboxPaused,
    SessionStarted,
)
from sandcell.agent.records.trace import read_trace
from sandcell.agent.telemetry import enabled
from sandcell.sandbox.execution import Execution
from tests.cli_runner import sandcell
from tests.otlp_receiver import receiving
from tests.polling import wait_for
from tests.scripted_server import ScriptedServer
from tests.test_jobs import make_jobs

CODE = "print(6 * 7)  # the cell's own words"


def test_traces_are_on_only_when_the_standard_variables_ask():
    assert not enabled({})
    assert enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert enabled({"OTEL_TRACES_EXPORTER": "console"})
    assert not enabled({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})
    assert not enabled({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})


def started(model: str = "tiny-model") -> SessionStarted:
    return SessionStarted(
        model=model, max_tokens=None, protocol="tools", inputs=[], image="i", limits={},
        rules={}, sandbox_start="background",
    )  # fmt: skip


def question(spans, number: int, *, timed_out: bool = False) -> None:
    """One question's events: a retried model request, a cell, an answer (or a stop)."""
    now = time.time()
    spans(Question(question=number, task="secret task words"))
    spans(ModelRequest(model="tiny-model", sent=now, duration_s=0.2, attempt=0, error="429"))
    spans(ModelRequest(
        model="tiny-model", sent=now + 0.3, duration_s=0.1, attempt=1, input_tokens=120,
        output_tokens=30, finish_reason="tool_calls",
    ))  # fmt: skip
    spans(ActionStarted(tool="python", args={"code": "print('the cell')"}, call_id="call_1"))
    execution = Execution(code="print('the cell')", timed_out=timed_out)
    spans(Observation(tool="python", ok=not timed_out, text="the output", execution=execution))
    answer = None if timed_out else "the answer"
    detail = "" if answer else "the same action again: print('the cell')"  # as a stop says it
    spans(Final(
        question=number, tokens=150, duration_s=1.0, answer=answer,
        stop_reason="answered" if answer else "repeated", detail=detail, error=None, steps=1,
    ))  # fmt: skip


@pytest.fixture
def own_exporter():
    """This test's exporting process, closed after it (the module keeps one a process)."""
    yield
    telemetry.close()


@pytest.mark.timeout(60)
def test_spans_of_questions_and_a_job_reach_a_collector_through_the_exporting_process(
    monkeypatch, own_exporter
):
    """Docker-free: a session's events through Spans and the real exporting process (its own
    OTEL_* variables) to the receiver; a batch job's span parents the questions given its
    traceparent, as on a Ray node."""
    with receiving() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        exporter = telemetry.the_exporter()
        assert exporter is not None
        job = telemetry.begin_job("job-07")
        spans = telemetry.spans_for("job-07", telemetry.traceparent(job))
        assert spans is not None
        spans(started())
        question(spans, 1)
        spans(SandboxPaused(reason="idle", seconds=0.5, size=10))  # between questions
        question(spans, 2, timed_out=True)
        telemetry.end_record(job, {"status": "answered"})
        alone = telemetry.spans_for("served-session")  # no parent: a trace of its own
        assert alone is not None
        alone(SandboxPaused(reason="idle", seconds=0.25, size=10))
        telemetry.flush()
        got = list(receiver.spans)
    (root,) = [s for s in got if s["name"] == "sandcell batch job"]
    assert root["parent"] == "" and root["attributes"]["sandcell.job.id"] == "job-07"
    agents = sorted(
        (s for s in got if s["name"] == "invoke_agent sandcell"), key=lambda s: s["start"]
    )
    assert [(a["trace_id"], a["parent"]) for a in agents] == [
        (root["trace_id"], root["span_id"])
    ] * 2
    assert [a["attributes"]["gen_ai.conversation.id"] for a in agents] == ["job-07"] * 2
    assert [a["status"] for a in agents] == [0, 2]  # unset, then error (stopped, no answer)
    assert agents[1]["attributes"]["error.type"] == "repeated"
    for agent in agents:
        under = [s for s in got if s["parent"] == agent["span_id"]]
        assert sorted(s["name"] for s in under) == [
            "chat tiny-model", "chat tiny-model", "execute_tool python",
        ]  # fmt: skip
        chats = sorted((s for s in under if s["name"].startswith("chat")), key=lambda s: s["start"])
        assert [c["attributes"]["sandcell.attempt"] for c in chats] == [0, 1]
        assert chats[0]["attributes"]["error.type"] == "429" and chats[0]["status"] == 2
        assert chats[1]["attributes"]["gen_ai.usage.input_tokens"] == 120
        assert chats[1]["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
        assert chats[1]["end"] - chats[1]["start"] == pytest.approx(0.1e9, rel=1e-3)
        (tool,) = [s for s in under if s["name"] == "execute_tool python"]
        assert tool["attributes"]["gen_ai.tool.call.id"] == "call_1"
        assert agent["start"] <= tool["start"] <= tool["end"] <= agent["end"]
    outcomes = [
        s["attributes"]["sandcell.cell.outcome"] for s in sorted(got, key=lambda s: s["start"])
        if s["name"] == "execute_tool python"
    ]  # fmt: skip
    assert outcomes == ["ok", "timeout"]
    pauses = sorted(
        (s for s in got if s["name"] == "sandbox pause"), key=lambda s: s["end"] - s["start"]
    )
    # between questions: the job's (a job a recipe solved asks none), or a trace of its own
    assert [(p["trace_id"], p["parent"]) for p in pauses] == [
        (pauses[0]["trace_id"], ""), (root["trace_id"], root["span_id"]),
    ]  # fmt: skip
    assert pauses[0]["trace_id"] != root["trace_id"]
    said = json.dumps([[s["attributes"], s["status_message"]] for s in got])
    assert "secret task words" not in said and "the cell" not in said and "the output" not in said


def test_traces_off_start_nothing(monkeypatch):
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_TRACES_EXPORTER",
    ):
        monkeypatch.delenv(name, raising=False)
    assert telemetry.begin_job("j") is None and telemetry.spans_for("s") is None
    telemetry.end_record(None, {"status": "answered"})
    assert telemetry._exporter is None  # no exporting process


def test_the_console_exporter_writes_to_stderr_and_a_flush_still_returns():
    code = (
        "from tests.test_telemetry import question, started\n"
        "from sandcell.agent import telemetry\n"
        "spans = telemetry.spans_for('s')\n"
        "spans(started())\n"
        "for n in range(40): question(spans, n)\n"
        "telemetry.flush()\n"
        "print('flushed')\n"
    )
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "flushed\n", done.stderr[-2000:]
    assert done.stderr.count('"name": "invoke_agent sandcell"') == 40


def test_a_collector_that_is_down_is_one_line_not_a_traceback(tmp_path):
    """The SDK's complaint reaches the terminal as one `sandcell: traces:` line; the process
    ends promptly all the same."""
    code = (
        "from tests.test_telemetry import question, started\n"
        "from sandcell.agent import telemetry\n"
        "spans = telemetry.spans_for('s')\n"
        "spans(started())\n"
        "for n in range(3): question(spans, n)\n"
    )  # and exits: the spans piped to the exporting process, which tries and says why not
    env = {
        **os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "30",  # it would retry this long
    }  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sandcell: traces: "), done.stderr
    # not held for the exporter's 30 s of retries: its process gives it 3 s at the end
    assert time.monotonic() - began < 20


@pytest.mark.docker
@pytest.mark.timeout(180)
@pytest.mark.parametrize("capture", [False, True], ids=["names-only", "content"])
def test_a_run_exports_one_trace_of_its_question(tmp_path, capture):
    script = [
        {
            "content": "Thought: compute.",
            "tool_calls": [{"name": "python", "arguments": {"code": CODE}}],
        },
        "Final Answer: 42.",
    ]
    out = tmp_path / "out"
    with ScriptedServer(script) as server, receiving() as receiver:
        env = {
            **os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "k",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "sandcell-test",
        }  # fmt: skip
        if capture:
            env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
        done = sandcell(
            "run", "--task", "What is 6 x 7?", "--output", str(out), "--model", "tiny-model",
            "--protocol", "tools", env=env, timeout=150,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        wait_for(lambda: receiver.named("invoke_agent"), 20, "the spans, flushed at exit")
        spans = list(receiver.spans)
    (agent,) = [s for s in spans if s["name"] == "invoke_agent sandcell"]
    chats = [s for s in spans if s["name"] == "chat tiny-model"]
    (tool,) = [s for s in spans if s["name"] == "execute_tool python"]
    (start,) = [s for s in spans if s["name"] == "sandbox start"]
    assert agent["parent"] == "" and agent["attributes"]["gen_ai.conversation.id"] == "out"
    assert agent["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    for child in [*chats, tool, start]:  # one trace, the question's
        assert (child["trace_id"], child["parent"]) == (agent["trace_id"], agent["span_id"])
    requests = [e for e in read_trace(out / "trace.jsonl") if e["type"] == "model_request"]
    assert [
        (
            c["attributes"]["gen_ai.usage.input_tokens"],
            c["attributes"]["gen_ai.usage.output_tokens"],
        )
        for c in sorted(chats, key=lambda c: c["start"])
    ] == [(r["input_tokens"], r["output_tokens"]) for r in requests]
    assert [c["attributes"]["gen_ai.response.finish_reasons"] for c in sorted(chats, key=lambda c: c["start"])] == [
        ["tool_calls"], ["stop"]
    ]  # fmt: skip
    assert tool["attributes"]["gen_ai.tool.name"] == "python"
    assert (
        tool["attributes"]["gen_ai.tool.call.id"]
        and tool["attributes"]["sandcell.cell.outcome"] == "ok"
    )
    # the sandbox began beside the first model request (before the question's span: its real
    # time), and was ready within the question
    assert (
        start["end"] <= agent["end"]
        and agent["start"] <= tool["start"] <= tool["end"] <= agent["end"]
    )
    said = json.dumps([s["attributes"] for s in spans])
    assert ("the cell's own words" in said, "What is 6 x 7?" in said, "42" in said) == (
        capture,
    ) * 3


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_a_batch_job_s_questions_are_in_the_job_s_trace(tmp_path):
    """Each job of a batch (threads: run where its driver is) is one trace: the driver's job
    span, its question under it with the job's id as the conversation."""
    jobs_file, _ = make_jobs(tmp_path, 2)
    jobs = [json.loads(line) for line in jobs_file.read_text().splitlines()]
    with receiving() as receiver:
        env = {
            **os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }  # fmt: skip
        done = sandcell(
            "batch", str(jobs_file), "--output", str(tmp_path / "out"), "--workers", "2",
            "--no-progress", env=env, timeout=200,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        wait_for(lambda: len(receiver.named("sandcell batch job")) == 2, 20, "the job spans")
        wait_for(lambda: len(receiver.named("invoke_agent")) == 2, 20, "the questions' spans")
        spans = list(receiver.spans)
    for job in jobs:
        (root,) = [
            s for s in spans
            if s["name"] == "sandcell batch job" and s["attributes"]["sandcell.job.id"] == job["id"]
        ]  # fmt: skip
        assert root["parent"] == "" and root["attributes"]["sandcell.job.status"] == "answered"
        (agent,) = [s for s in spans if s["parent"] == root["span_id"]]
        assert agent["name"] == "invoke_agent sandcell"
        assert agent["attributes"]["gen_ai.conversation.id"] == job["id"]
        under = sorted(s["name"] for s in spans if s["parent"] == agent["span_id"])
        assert under == ["chat replay:" + job["replay"]] * 2 + [
            "execute_tool python", "sandbox start",
        ]  # fmt: skip
