"""OpenTelemetry traces (agent/telemetry.py): a real `sandcell run` against a scripted model
server exports through the real OTLP/HTTP exporter to a receiver in this test
(tests/otlp_receiver.py, decoding its protobuf): one trace per question, `invoke_agent`
its root, `chat {model}` per model request and `execute_tool {name}` per tool call under it,
the sandbox's start too; token counts as the trace file has them; no code or output in any
span unless OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT says so."""

import json
import os

import pytest

from sandcell.agent.records.trace import read_trace
from sandcell.agent.telemetry import enabled
from tests.cli_runner import sandcell
from tests.otlp_receiver import receiving
from tests.polling import wait_for
from tests.scripted_server import ScriptedServer

CODE = "print(6 * 7)  # the cell's own words"


def test_traces_are_on_only_when_the_standard_variables_ask():
    assert not enabled({})
    assert enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert enabled({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert enabled({"OTEL_TRACES_EXPORTER": "console"})
    assert not enabled({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})
    assert not enabled({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})


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
