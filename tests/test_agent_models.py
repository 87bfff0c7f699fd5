"""OpenAIModel: the real `openai` client over HTTP against the scripted server: streaming and
not, tool calls, usage, retries on 429/5xx/timeouts/malformed bodies, and the clear errors."""

import time

import pytest

from agent.models import OpenAIModel
from agent.scripted import ScriptedModel
from agent.seams import ModelError, ToolsUnsupported
from tests.scripted_server import ScriptedServer, dead_url

USER = [{"role": "user", "content": "hi"}]
TOOL = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def model(server, **kw):
    kw.setdefault("retry_base_s", 0.01)
    return OpenAIModel("test-model", base_url=server.url, api_key="k", **kw)


def test_text_reply_usage_and_request_options():
    with ScriptedServer(
        [{"content": "hello", "usage": {"prompt_tokens": 11, "completion_tokens": 2}}]
    ) as s:
        reply = model(s, temperature=0.3, max_tokens=77).complete(USER, stop=["\nObservation:"])
    assert (reply.text, reply.finish_reason, reply.retries) == ("hello", "stop", 0)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.estimated) == (
        11,
        2,
        False,
    )
    sent = s.requests[0]
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == ("test-model", 0.3, 77)
    assert sent["stop"] == ["\nObservation:"] and "tools" not in sent


def test_streaming_text_and_tool_calls_reach_the_callback_and_are_assembled():
    calls = [
        {"name": "calculator", "arguments": {"expression": "2+2"}},
        {"name": "python", "arguments": {"code": "print('a long enough argument string')"}},
    ]
    with ScriptedServer(
        [
            "Thought: streaming works in small pieces",
            {
                "content": "two calls",
                "tool_calls": calls,
                "usage": {"prompt_tokens": 5, "completion_tokens": 9},
            },
        ]
    ) as s:
        tokens: list[str] = []
        m = model(s)
        first = m.complete(USER, on_token=tokens.append)
        second = m.complete(USER, TOOL, on_token=tokens.append)
    assert first.text == "Thought: streaming works in small pieces"
    assert len(tokens) > 3 and "".join(tokens) == first.text + "two calls"
    assert [(c.name, c.arguments) for c in second.tool_calls] == [
        ("calculator", '{"expression": "2+2"}'),
        ("python", '{"code": "print(\'a long enough argument string\')"}'),
    ]
    assert second.finish_reason == "tool_calls" and second.usage.total == 14
    assert s.requests[1]["stream"] is True and s.requests[1]["tools"] == TOOL


def test_429_then_success_honours_retry_after():
    with ScriptedServer([{"error": 429, "retry_after": 0.3}, "ok"]) as s:
        started = time.monotonic()
        reply = model(s).complete(USER)
    assert reply.text == "ok" and reply.retries == 1
    assert time.monotonic() - started >= 0.3
    assert len(s.requests) == 2


@pytest.mark.parametrize(
    "failure",
    [{"error": 500}, {"error": 503}, {"malformed": True}, {"delay": 1.5, "content": "too late"}],
    ids=["500", "503", "malformed", "slow"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_transient_failures_are_retried(failure, stream):
    with ScriptedServer([dict(failure), "recovered"]) as s:
        reply = model(s, timeout_s=0.7).complete(
            USER, on_token=(lambda t: None) if stream else None
        )
    assert reply.text == "recovered" and reply.retries == 1


def test_retries_used_up_give_one_clear_error():
    with ScriptedServer([{"error": 429}] * 3) as s, pytest.raises(ModelError) as err:
        model(s, max_retries=2).complete(USER)
    message = str(err.value)
    assert s.url in message and "429" in message and "3 tries" in message
    assert "Traceback" not in message


def test_endpoint_down_names_the_url_and_what_to_check():
    url = dead_url()
    started = time.monotonic()
    with pytest.raises(ModelError) as err:
        OpenAIModel("m", base_url=url, api_key="k", retry_base_s=0.01).complete(USER)
    message = str(err.value)
    assert url in message and "OPENAI_BASE_URL" in message and "running" in message
    assert err.value.__cause__ is None  # raised `from None`: one message, no chained traceback
    assert time.monotonic() - started < 10


def test_rejected_key_names_the_url_and_the_key_variable():
    with ScriptedServer(["never"], api_key="right-key") as s, pytest.raises(ModelError) as err:
        OpenAIModel("m", base_url=s.url, api_key="wrong-key").complete(USER)
    assert (
        s.url in str(err.value) and "OPENAI_API_KEY" in str(err.value) and "401" in str(err.value)
    )
    assert s.left() == 1  # not retried


def test_endpoint_refusing_tools_raises_tools_unsupported():
    with ScriptedServer(["fine without tools"], reject_tools=True) as s:
        m = model(s)
        with pytest.raises(ToolsUnsupported):
            m.complete(USER, TOOL)
        assert m.complete(USER).text == "fine without tools"


def test_settings_come_from_the_environment(monkeypatch):
    with ScriptedServer(["from env"], api_key="env-key") as s:
        monkeypatch.setenv("OPENAI_BASE_URL", s.url)
        monkeypatch.setenv("OPENAI_API_KEY", "env-key")
        monkeypatch.setenv("SANDCELL_MODEL", "env-model")
        m = OpenAIModel()
        assert m.complete(USER).text == "from env"
    assert s.requests[0]["model"] == "env-model"


def test_no_key_for_the_openai_default_endpoint_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-4o-mini")


def test_missing_usage_is_estimated():
    with ScriptedServer(
        [{"content": "x" * 400, "usage": {"prompt_tokens": 0, "completion_tokens": 0}}]
    ) as s:
        reply = model(s).complete(USER)
    assert reply.usage.estimated and reply.usage.completion_tokens == 100


def test_scripted_model_replays_a_jsonl_file(tmp_path):
    script = tmp_path / "replies.jsonl"
    script.write_text(
        '"Thought: look\\nAction: calculator\\nAction Input: {\\"expression\\": \\"1+1\\"}"\n'
        '{"content": "", "tool_calls": [{"name": "calculator", "arguments": {"expression": "2+2"}}]}\n'
    )
    m = ScriptedModel(script)
    assert m.name == "replay:replies.jsonl"
    first = m.complete(USER, stop=["\nObservation:"])
    assert first.text.startswith("Thought: look")
    text_mode = m.complete(USER)  # no tools offered: the call is replayed as a JSON block
    assert '"tool": "calculator"' in text_mode.text and not text_mode.tool_calls
    with pytest.raises(ModelError, match="no reply left"):
        m.complete(USER)


def test_scripted_model_bad_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ModelError, match="bad.jsonl"):
        ScriptedModel(bad)
