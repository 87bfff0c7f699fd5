"""OpenAIModel: the real `openai` client over HTTP against the scripted server: every reply
streamed, tool calls, usage, the reply cap, retries on 429/5xx/timeouts/malformed bodies before
any token, none once tokens arrived, and the clear errors. ScriptedModel: its script checked
entry by entry when loaded."""

import json
import pickle
import time

import click
import pytest
from click.testing import CliRunner

from sandcell.agent.cli import exits, main
from sandcell.agent.cli.options import agent_options, build_model
from sandcell.agent.model.openai_model import OpenAIModel
from sandcell.agent.model.scripted import ScriptedModel, ScriptError
from sandcell.agent.model.settings import DEFAULT_MAX_TOKENS, ModelSettings
from sandcell.agent.seams import ModelError, ToolsUnsupported
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
    assert sent["stream"] is True  # streamed with no callback too: the timeout is per chunk


# -- the reply cap: --max-tokens, SANDCELL_MAX_TOKENS, 4096 ------------------------------------------


def test_max_tokens_is_always_sent_4096_unless_the_environment_or_caller_says(monkeypatch):
    monkeypatch.delenv("SANDCELL_MAX_TOKENS", raising=False)
    with ScriptedServer(["a", "b", "c"]) as s:
        assert model(s).max_tokens == DEFAULT_MAX_TOKENS == 4096
        model(s).complete(USER)
        monkeypatch.setenv("SANDCELL_MAX_TOKENS", "123")
        model(s).complete(USER)
        model(s, max_tokens=77).complete(USER)  # the caller (the CLI flag) wins
    assert [r["max_tokens"] for r in s.requests] == [4096, 123, 77]


@pytest.mark.parametrize("value", ["0", "lots"])
def test_a_bad_max_tokens_variable_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("SANDCELL_MAX_TOKENS", value)
    with pytest.raises(ModelError, match=f"SANDCELL_MAX_TOKENS={value!r}"):
        OpenAIModel("m", base_url="http://127.0.0.1:9/v1")


def _parsed(args: list[str], env: dict | None = None):
    """The shared options of run/batch/chat, parsed by click in env: the result and opts."""
    seen = []

    @click.command()
    @agent_options
    def probe(opts):
        seen.append(opts)

    result = CliRunner().invoke(probe, args, env=env)
    return result, (seen[0] if seen else None)


def _probe(args: list[str], env: dict | None = None):
    """The shared options of run/batch/chat, parsed by click, built into a model."""
    result, opts = _parsed(args, env)
    return result, (build_model(opts) if opts else None)


def test_max_tokens_flag_and_variable_reach_the_request():
    with ScriptedServer(["a", "b", "c"]) as s:
        url = ["--base-url", s.url, "--api-key", "k"]
        for args, env in [
            ([], {"SANDCELL_MAX_TOKENS": None}),
            ([], {"SANDCELL_MAX_TOKENS": "321"}),
            (["--max-tokens", "50"], {"SANDCELL_MAX_TOKENS": "321"}),
        ]:
            result, built = _probe(url + args, env)
            assert result.exit_code == 0, result.output
            built.complete(USER)
    assert [r["max_tokens"] for r in s.requests] == [4096, 321, 50]
    refused = _probe(["--max-tokens", "0"])[0]
    assert refused.exit_code == 2 and "--max-tokens" in refused.output
    shown = " ".join(CliRunner().invoke(main, ["run", "--help"]).stdout.split())
    assert "--max-tokens INTEGER RANGE" in shown and "SANDCELL_MAX_TOKENS" in shown
    assert "[default: 4096; x>=1]" in shown or "[x>=1; default: 4096]" in shown


def test_an_endpoint_refusing_max_tokens_gets_max_completion_tokens():
    """OpenAI's o-series and gpt-5 models take only max_completion_tokens."""
    with ScriptedServer(["capped", "again"], reject_params=("max_tokens",)) as s:
        m = model(s)
        assert m.complete(USER).text == "capped"
        assert m.complete(USER).text == "again"  # remembered: no second refusal
    assert [("max_tokens" in r, r.get("max_completion_tokens")) for r in s.requests] == [
        (True, None),
        (False, 4096),
        (False, 4096),
    ]


def test_an_endpoint_refusing_stream_options_streams_without_them():
    """Strict servers refuse unknown fields; usage is then estimated."""
    with ScriptedServer(["no usage", "still none"], reject_params=("stream_options",)) as s:
        m = model(s)
        first = m.complete(USER)
        assert (first.text, first.usage.estimated) == ("no usage", True)
        assert m.complete(USER).text == "still none"
    assert ["stream_options" in r for r in s.requests] == [True, False, False]
    assert all(r["stream"] for r in s.requests)


# -- what real servers do differently (llama-cpp-python, vLLM): tests/test_realmodel.py runs one --


def test_tools_carry_tool_choice_auto_unless_another_is_asked():
    """llama-cpp-python's chatml-function-calling ignores tools sent without a tool_choice."""
    with ScriptedServer(["a", "b", "c"]) as s:
        m = model(s)
        m.complete(USER, TOOL)
        m.complete(USER, TOOL, tool_choice="required")
        m.complete(USER)
    assert [r.get("tool_choice") for r in s.requests] == ["auto", "required", None]


REFUSALS = {
    # llama-cpp-python's chatml-function-calling: a failed assertion, an HTTP 500 saying nothing
    "llama-cpp-python 500": {"error": 500, "message": ""},
    "vllm 400": {"error": 400, "message": 'tool_choice = "required" is not supported!'},
}


@pytest.mark.parametrize("refusal", REFUSALS)
def test_a_refused_tool_choice_is_dropped_once_and_not_sent_again(refusal):
    with ScriptedServer([REFUSALS[refusal], "fine", "again"]) as s:
        m = model(s)
        assert m.complete(USER, TOOL, tool_choice="required").text == "fine"
        assert m.complete(USER, TOOL, tool_choice="required").text == "again"
    assert [r["tool_choice"] for r in s.requests] == ["required", "auto", "auto"]


def test_an_ordinary_500_to_a_required_tool_choice_is_retried_with_it():
    with ScriptedServer([{"error": 500}, "fine"]) as s:
        reply = model(s).complete(USER, TOOL, tool_choice="required")
    assert reply.retries == 1 and [r["tool_choice"] for r in s.requests] == ["required"] * 2


def test_an_endpoint_refusing_tool_choice_altogether_is_asked_without_it():
    with ScriptedServer(["fine", "again"], reject_params=("tool_choice",)) as s:
        m = model(s)
        assert m.complete(USER, TOOL, tool_choice="required").text == "fine"
        assert m.complete(USER, TOOL).text == "again"
    assert [r.get("tool_choice") for r in s.requests] == ["required", "auto", None, None]


@pytest.mark.parametrize("drop", ["eof", "chunked", "no_response"])
def test_a_stream_closed_before_any_chunk_is_asked_again_unstreamed_for_the_error(drop):
    """llama-cpp-python answers 200 to a streamed request, then closes it when the request
    fails (here: too long for its context); unstreamed, it says why, and that is the error."""
    said = "This model's maximum context length is 2048 tokens. However, you requested 5000"
    with (
        ScriptedServer([{"drop": drop}, {"error": 400, "message": said}, "never"]) as s,
        pytest.raises(ModelError) as err,
    ):
        model(s).complete(USER)
    assert said in str(err.value) and "HTTP 400" in str(err.value)
    assert [r.get("stream", False) for r in s.requests] == [True, False] and s.left() == 1


@pytest.mark.parametrize("drop", ["eof", "chunked", "no_response"])
def test_a_tool_call_a_server_cannot_stream_comes_unstreamed_and_text_still_streams(drop):
    """llama-cpp-python's chatml-function-calling cannot stream a tool call its model chose
    ("Automatic streaming tool choice is not supported"): that reply comes whole, with the
    server's usage; a text reply after it streams as before."""
    call = {"name": "calculator", "arguments": {"expression": "2+2"}, "id": "call_x"}
    whole = {
        "content": "",
        "tool_calls": [call],
        "usage": {"prompt_tokens": 40, "completion_tokens": 9},
    }
    with ScriptedServer([{"drop": drop}, whole, "streamed text"]) as s:
        m = model(s)
        tokens: list[str] = []
        first = m.complete(USER, TOOL, on_token=tokens.append)
        text = m.complete(USER, TOOL, on_token=tokens.append)
    assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
        ("call_x", "calculator", '{"expression": "2+2"}')
    ]
    assert first.finish_reason == "tool_calls" and first.retries == 0
    assert (first.usage.total, first.usage.estimated) == (49, False)
    assert text.text == "streamed text" and len(tokens) > 1 and "".join(tokens) == text.text
    assert [r.get("stream", False) for r in s.requests] == [True, False, True]


def test_a_timeout_of_an_unstreamed_request_is_not_retried():
    """Nothing arrives before the end of an unstreamed reply, so a timeout may leave the
    server busy with it: one clear error, no second request queued behind the first."""
    with ScriptedServer([{"drop": "eof"}, {"delay": 1.5, "content": "late"}, "never"]) as s:
        with pytest.raises(ModelError) as err:
            model(s, timeout_s=0.7).complete(USER, TOOL)
        assert s.left() == 1 and len(s.requests) == 2
    assert "not retried" in str(err.value) and "--protocol react" in str(err.value)


def test_a_tool_call_in_the_history_goes_out_with_empty_content_not_null():
    """llama-cpp-python's server validates an assistant message's content as a string."""
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
    ]
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    with ScriptedServer(["fine"]) as s:
        model(s).complete(history, TOOL)
    sent = s.requests[0]["messages"]
    assert sent[1] == {"role": "assistant", "content": "", "tool_calls": calls}
    assert sent[2] == history[2] and history[1]["content"] is None  # the history is unchanged


def test_a_500_saying_the_request_is_invalid_is_not_retried():
    said = "2 validation errors: {'type': 'string_type', 'loc': ('body', 'messages', 1)}"
    with (
        ScriptedServer([{"error": 500, "message": said}, "never"]) as s,
        pytest.raises(ModelError) as err,
    ):
        model(s).complete(USER)
    assert "HTTP 500" in str(err.value) and "validation errors" in str(err.value)
    assert len(s.requests) == 1 and s.left() == 1


def test_a_streamed_reply_past_max_tokens_is_cut_when_the_server_ignores_the_cap():
    """llama-cpp-python's chatml-function-calling ignores max_tokens under tool_choice "auto";
    every chunk holds a token at least, so more chunks than max_tokens is past the cap."""
    with ScriptedServer([{"content": "ab" * 40, "chunk_size": 2}, "next"]) as s:
        reply = model(s, max_tokens=10).complete(USER, TOOL)
        assert s.left() == 1
    assert (reply.text, reply.finish_reason, reply.retries) == ("ab" * 11, "length", 0)


def test_an_unstreamed_request_waits_no_longer_than_the_callers_deadline():
    with ScriptedServer([{"drop": "eof"}, {"delay": 30, "content": "late"}, "never"]) as s:
        started = time.monotonic()
        with pytest.raises(ModelError) as err:
            model(s).complete(USER, TOOL, deadline=started + 1.0)
        took = time.monotonic() - started
        assert s.left() == 1
    said = str(err.value)  # nothing came before the deadline: no headers, so no response
    assert took < 10 and "still busy with the request when the question's wall time" in said
    assert "no response yet" in said and "--protocol react" in said


def test_a_stream_without_usage_is_estimated_and_marked():
    """llama-cpp-python accepts stream_options but streams no usage."""
    with ScriptedServer(["x" * 400], stream_usage=False) as s:
        reply = model(s).complete(USER)
    assert reply.usage.estimated and reply.usage.completion_tokens == 100
    assert s.requests[0]["stream_options"] == {"include_usage": True}


# -- streaming: the read timeout is between chunks; no retry once tokens arrived -----------------


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


def test_429_then_success_honours_retry_after_and_each_attempt_is_said():
    attempts = []
    with ScriptedServer([{"error": 429, "retry_after": 0.3}, "ok"]) as s:
        started = time.monotonic()
        reply = model(s).complete(USER, on_attempt=attempts.append)
    assert reply.text == "ok" and reply.retries == 1
    assert time.monotonic() - started >= 0.3
    assert len(s.requests) == 2
    refused, answered = attempts  # the retry's wait is in neither
    assert (refused.number, refused.error, refused.usage) == (0, "429", None)
    assert (answered.number, answered.error, answered.finish_reason) == (1, None, "stop")
    assert answered.usage == reply.usage and answered.started >= refused.started + 0.3


@pytest.mark.parametrize("callback", [False, True], ids=["quiet", "on_token"])
def test_a_reply_streamed_for_longer_than_the_timeout_succeeds(callback):
    """A slow but working server (a small model on a CPU): 11 chunks 0.4 s apart, over 4 s,
    with a 2 s timeout, which holds between chunks and not for the whole reply. (The gap
    leaves the timeout room: a loaded machine may add a second between two chunks.)"""
    reply_text = "Thought: a slow server still gets there in the end."  # 8 chunks of 7
    call = {"name": "calculator", "arguments": {"expression": "1+1"}}  # 3 more chunks
    tokens: list[str] = []
    with ScriptedServer([{"content": reply_text, "tool_calls": [call], "chunk_delay": 0.4}]) as s:
        started = time.monotonic()
        reply = model(s, timeout_s=2.0).complete(
            USER, TOOL, on_token=tokens.append if callback else None
        )
        took = time.monotonic() - started
    assert took >= 4.0 and reply.retries == 0 and len(s.requests) == 1
    assert reply.text == reply_text and reply.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("calculator", '{"expression": "1+1"}')
    ]
    assert "".join(tokens) == (reply_text if callback else "")


@pytest.mark.parametrize("callback", [False, True], ids=["quiet", "on_token"])
def test_a_stall_after_the_first_tokens_is_one_clear_error_and_no_retry(callback):
    """The server stops sending mid-reply: it may still be generating, so a second request
    would only queue behind the first. One error, one request."""
    tokens: list[str] = []
    with ScriptedServer(
        [
            {
                "content": "Thought: I will now think for ever and ever",
                "stall_after": 3,
                "stall_s": 30,
            },
            "never",
        ]
    ) as s:
        started = time.monotonic()
        with pytest.raises(ModelError) as err:
            model(s, timeout_s=0.5).complete(USER, on_token=tokens.append if callback else None)
        took = time.monotonic() - started
        assert len(s.requests) == 1 and s.left() == 1
    message = str(err.value)
    assert s.url in message and "3 chunks" in message and "21 characters" in message
    assert "no data for 0.5 s" in message and "not retried" in message
    assert "--max-tokens" in message and "SANDCELL_MAX_TOKENS" in message
    assert "'Thought: I will now t'" in message  # what arrived, so the user sees where it stuck
    assert err.value.__cause__ is None and "\n" not in message
    assert took < 10, took  # the 0.5 s between chunks, not the stall's end
    assert "".join(tokens) == ("Thought: I will now t" if callback else "")


def test_a_stream_closed_mid_reply_is_not_taken_for_the_whole_reply():
    """The connection closes cleanly after a few chunks, with no finish_reason: half a reply
    (half a final answer, half a tool call) must not pass for a whole one."""
    with (
        ScriptedServer(
            [
                {"content": "Final Answer: the total is 12", "stall_after": 2, "stall_s": 0.1},
                "never",
            ]
        ) as s,
        pytest.raises(ModelError) as err,
    ):
        model(s).complete(USER)
    message = str(err.value)
    assert "2 chunks" in message and "without a finish_reason" in message
    assert "'Final Answer: '" in message and len(s.requests) == 1


def test_an_error_event_mid_stream_is_one_clear_error_and_no_retry():
    with (
        ScriptedServer(
            [
                {"content": "Thought: half a reply", "stream_error_after": 2, "message": "KV full"},
                "never",
            ]
        ) as s,
        pytest.raises(ModelError) as err,
    ):
        model(s).complete(USER)
    message = str(err.value)
    assert s.url in message and "KV full" in message and "2 chunks" in message
    assert len(s.requests) == 1


@pytest.mark.parametrize("callback", [False, True], ids=["quiet", "on_token"])
def test_reasoning_sent_apart_is_kept_as_a_think_block(callback):
    tokens: list[str] = []
    with ScriptedServer([{"content": "Final Answer: 4", "reasoning": "2 and 2 make 4"}]) as s:
        reply = model(s).complete(USER, on_token=tokens.append if callback else None)
    assert reply.text == "<think>2 and 2 make 4</think>\nFinal Answer: 4"
    assert "".join(tokens) == (reply.text if callback else "")


@pytest.mark.parametrize(
    "failure",
    [
        {"error": 500},
        {"error": 503},
        {"malformed": True},
    ],
    ids=["500", "503", "malformed"],
)
@pytest.mark.parametrize("callback", [False, True], ids=["quiet", "on_token"])
def test_transient_failures_before_any_token_are_retried(failure, callback):
    with ScriptedServer([dict(failure), "recovered"]) as s:
        reply = model(s, timeout_s=0.7).complete(
            USER, on_token=(lambda t: None) if callback else None
        )
    assert reply.text == "recovered" and reply.retries == 1
    assert [r["stream"] for r in s.requests] == [True, True]


@pytest.mark.parametrize(
    "failure",
    [{"delay": 1.5, "content": "too late"}, {"stall_after": 0, "stall_s": 1.5, "content": "x"}],
    ids=["slow", "stall-before-tokens"],
)
def test_a_timeout_before_any_token_is_one_clear_error_and_no_retry(failure):
    """Nothing arrived in time, but the server may still be working on the request (a local
    one reading a long prompt): a second request would queue behind it, so none is sent."""
    with ScriptedServer([dict(failure), "never"]) as s, pytest.raises(ModelError) as err:
        model(s, timeout_s=0.7).complete(USER)
    assert len(s.requests) == 1 and s.left() == 1
    assert "sent nothing within 0.7 s" in str(err.value) and "not retried" in str(err.value)


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


def test_settings_resolve_what_is_given_over_the_variables_over_the_defaults():
    env = {
        "SANDCELL_MODEL": "env-model",
        "OPENAI_BASE_URL": "http://h:1/v1/",
        "OPENAI_API_KEY": "ek",
    }
    env["SANDCELL_MAX_TOKENS"] = "321"
    assert ModelSettings.from_env(env) == ModelSettings(
        "env-model", "http://h:1/v1", "ek", 0.0, 321
    )
    given = ModelSettings.from_env(
        env, name="m", base_url="http://g:2/v1", api_key="gk", max_tokens=7, temperature=0.5
    )
    assert given == ModelSettings("m", "http://g:2/v1", "gk", 0.5, 7)
    unset = {k: "" for k in env}  # an empty variable counts as unset, as click's envvar did
    assert ModelSettings.from_env(unset) == ModelSettings() == ModelSettings.from_env({})
    assert ModelSettings().max_tokens == DEFAULT_MAX_TOKENS == 4096
    with pytest.raises(ModelError, match="SANDCELL_MAX_TOKENS='0'"):
        ModelSettings.from_env({"SANDCELL_MAX_TOKENS": "0"})


def test_the_cli_reads_the_environment_once_and_a_flag_overrides_it(monkeypatch):
    """The CLI's flags and variables become one ModelSettings when the command starts; the
    client built from it does not read the environment again (it did: a --model not given
    was looked up once by click and again by OpenAIModel)."""
    with ScriptedServer(["from flags", "from env"], api_key="env-key") as s:
        env = {"OPENAI_BASE_URL": s.url, "OPENAI_API_KEY": "env-key"}
        env.update(SANDCELL_MODEL=None, SANDCELL_MAX_TOKENS=None)
        result, opts = _parsed(["--model", "flag-model", "--max-tokens", "9"], env)
        assert result.exit_code == 0, result.output
        assert opts["model"] == ModelSettings("flag-model", s.url, "env-key", 0.0, 9)
        assert not {"model_name", "base_url", "api_key", "max_tokens"} & set(opts)
        build_model(opts).complete(USER)
        result, opts = _parsed([], env)
        monkeypatch.setenv("SANDCELL_MODEL", "changed-later")
        monkeypatch.setenv("SANDCELL_MAX_TOKENS", "5")
        build_model(opts).complete(USER)
    assert [(r["model"], r["max_tokens"]) for r in s.requests] == [
        ("flag-model", 9),
        ("gpt-4o-mini", 4096),
    ]
    bad = _parsed([], {"SANDCELL_MAX_TOKENS": "lots"})[0]
    assert bad.exit_code == 2 and "SANDCELL_MAX_TOKENS='lots'" in bad.output


def test_settings_travel_pickled_with_the_key_kept_out_of_reprs():
    settings = ModelSettings.from_env(
        {}, name="m", base_url="https://me:pa55word@h.example/v1?api_key=q-SECRET", api_key="SK-1"
    )
    assert pickle.loads(pickle.dumps(settings)) == settings  # as it goes to a Ray node
    model = OpenAIModel.from_settings(settings)
    for shown in (repr(settings), str(settings), repr(model)):
        assert "SK-1" not in shown and "pa55word" not in shown and "q-SECRET" not in shown
        assert "h.example" in shown
    # a Ray node given no key by the driver takes its own; the rest stays the driver's
    node = {"OPENAI_API_KEY": "node-key", "SANDCELL_MODEL": "other", "SANDCELL_MAX_TOKENS": "5"}
    keyless = ModelSettings.from_env({}, name="m", base_url="http://h:1/v1", max_tokens=9)
    assert keyless.filled(node) == ModelSettings("m", "http://h:1/v1", "node-key", 0.0, 9)


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
    with pytest.raises(ScriptError, match="bad.jsonl"):
        ScriptedModel(bad)


BAD_ENTRIES = {
    "no name": ({"tool_calls": [{"arguments": {}}]}, 'tool call 1 has no "name"'),
    "tool_calls not a list": ({"tool_calls": "x"}, '"tool_calls" must be a list'),
    "a number": (42, "is 42, not a string or an object"),
    "content not text": ({"content": 5}, '"content" must be a string, not 5'),
    "arguments not an object": (
        {"tool_calls": [{"name": "python", "arguments": 7}]},
        'tool call 1: "arguments" must be an object or a JSON string, not 7',
    ),
    "an unknown key": ({"text": "hi"}, "unknown key 'text'"),
}


@pytest.mark.parametrize("form", ["json", "jsonl"])
@pytest.mark.parametrize("bad", BAD_ENTRIES)
def test_scripted_model_names_the_file_entry_and_key_of_a_bad_entry(tmp_path, bad, form):
    entry, words = BAD_ENTRIES[bad]
    script = tmp_path / f"replies.{form}"
    entries = ["Thought: fine", entry]
    if form == "json":
        script.write_text(json.dumps(entries, indent=1))
        where = f"{script}: entry 2"
    else:  # a blank line: the entry number and the line number differ
        script.write_text(f"{json.dumps(entries[0])}\n\n{json.dumps(entry)}\n")
        where = f"{script}:3: entry 2"
    with pytest.raises(ScriptError) as err:
        ScriptedModel(script)
    assert str(err.value).startswith(where) and words in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", BAD_ENTRIES)
def test_run_with_a_bad_replay_entry_is_one_line_and_exit_2(tmp_path, bad):
    script = tmp_path / "bad.json"
    script.write_text(json.dumps(["Thought: fine", BAD_ENTRIES[bad][0]]))
    out = tmp_path / "o"
    result = CliRunner().invoke(
        main, ["run", "--task", "x", "--output", str(out), "--replay", str(script)]
    )
    assert result.exit_code == exits.USAGE == 2, result.output
    assert result.stderr.startswith(f"sandcell: {script}: entry 2")
    assert BAD_ENTRIES[bad][1] in result.stderr
    assert result.stderr.count("\n") == 1 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and result.stdout == ""
