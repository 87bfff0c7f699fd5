"""The loop where no code runs: token budget, retries, a dead endpoint, format errors, and the
inputs' profiles. The real `openai` client over HTTP to the scripted server; the sessions'
sandboxes start on demand and nothing asks for one, so these need no Docker at all (each test
checks that no sandbox was started)."""

import json
from pathlib import Path

import pytest

from sandcell import Agent, OpenAIModel, Rules
from sandcell.agent import prompts
from sandcell.agent.records.trace import read_trace
from sandcell.tools import profile as profile_module
from tests.scripted_server import ScriptedServer, dead_url

pytestmark = pytest.mark.timeout(60)

SALES = Path(__file__).parent / "data" / "agent" / "sales.csv"


def agent(url: str, rules: Rules | None = None, **kw) -> Agent:
    model = OpenAIModel("scripted", base_url=url, api_key="k", retry_base_s=0.01)
    return Agent(model, rules=rules or Rules(), sandbox_start="on_demand", **kw)


def call(name, **args):
    return {"name": name, "arguments": args}


def no_sandbox_started(trace: Path) -> bool:
    events = read_trace(trace)
    sandbox = [e for e in events if e["type"] == "sandbox"]
    return len(sandbox) == 1 and sandbox[0]["used"] is False and sandbox[0]["start_s"] is None


def test_token_budget_stops_the_run(tmp_path):
    heavy = {
        "tool_calls": [call("calculator", expression="1 + 1")],
        "usage": {"prompt_tokens": 500, "completion_tokens": 600},
    }
    with ScriptedServer([heavy, "never"]) as server:
        result = agent(server.url, Rules(token_budget=1000), protocol="tools").run(
            "x", [SALES], tmp_path
        )
    assert result.stop_reason == "token_budget" and "1100" in result.detail and server.left() == 1
    assert no_sandbox_started(result.trace_path)


def test_429_then_500_then_success(tmp_path):
    with ScriptedServer(
        [{"error": 429, "retry_after": 0}, {"error": 500}, "Final Answer: 12 rows."]
    ) as server:
        result = agent(server.url).run("Rows?", [SALES], tmp_path)
    assert result.answered and result.answer == "12 rows." and len(server.requests) == 3
    assert no_sandbox_started(result.trace_path)


def test_endpoint_down_gives_the_clear_error(tmp_path):
    url = dead_url()
    result = agent(url).run("Rows?", [SALES], tmp_path)
    assert result.stop_reason == "model_error" and result.answer is None
    assert (
        url in result.error
        and "OPENAI_BASE_URL" in result.error
        and "Traceback" not in result.error
    )
    final = next(e for e in read_trace(result.trace_path) if e["type"] == "final")
    assert final["error"] == result.error
    assert no_sandbox_started(result.trace_path)


def test_format_errors_are_recovered_without_running_code(tmp_path):
    script = [
        "The data probably has 12 rows.",  # prose without a label
        "",  # empty
        'Thought: search\nAction: web_search\nAction Input: {"query": "sales"}',  # unknown tool
        'Thought: calc\nAction: calculator\nAction Input: {"expression": "3 * 4",}',  # repaired
        {
            "content": "Thought: long\nAction: calculator\nAction Input: {",
            "finish_reason": "length",
        },
        "Thought: try calc\nAction: calculator\nAction Input: {{{",  # unrepairable
        "Thought: done\nFinal Answer: There are 12 rows.",
    ]
    with ScriptedServer(script) as server:
        result = agent(server.url, protocol="react").run("How many rows?", [SALES], tmp_path)
    assert result.answered and result.answer == "There are 12 rows.", result
    feedback = [r["messages"][-1]["content"] for r in server.requests[1:]]
    assert feedback[0].endswith(prompts.UNLABELLED)
    assert "empty" in feedback[1]
    assert "unknown tool `web_search`" in feedback[2] and "python" in feedback[2]
    assert feedback[3] == "Observation: 12"
    assert feedback[4] == prompts.LENGTH_NUDGE
    assert "{{{" in feedback[5]
    assert no_sandbox_started(result.trace_path)


def test_each_input_is_profiled_once_per_session(tmp_path, monkeypatch):
    """The prompt's profile and every file_metadata answer about an unchanged input come from
    one profile build; a changed file is profiled again."""
    builds = []
    real = profile_module.build_profile

    def counting(name, *args, **kwargs):
        builds.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr("sandcell.tools.file_metadata.build_profile", counting)
    data = tmp_path / "sales.csv"
    data.write_bytes(SALES.read_bytes())
    script = [
        {"tool_calls": [call("file_metadata", path="/data/sales.csv")]},
        {"tool_calls": [call("file_metadata", path="sales.csv")]},
        "Final Answer: 12 rows.",
        {"tool_calls": [call("file_metadata", path="/data/sales.csv")]},
        "Final Answer: 13 rows.",
    ]
    with (
        ScriptedServer(script) as server,
        agent(server.url, protocol="tools").session([data], tmp_path / "s") as session,
    ):
        first = session.ask("Rows?")
        assert builds == ["/data/sales.csv"]  # the prompt's profile, reused twice by the tool
        system = server.requests[0]["messages"][0]["content"]
        tool_answer = server.requests[1]["messages"][-1]["content"]
        assert "unit_price" in system and "unit_price" in tool_answer
        with data.open("a") as f:
            f.write("2024-02-01,East,widget,1,2.5\n")
        second = session.ask("Rows now?")
    assert first.answered and second.answered
    assert builds == ["/data/sales.csv", "/data/sales.csv"]  # changed, so profiled once more
    assert "13 rows" in server.requests[4]["messages"][-1]["content"]
    session_event = read_trace(first.trace_path)[0]
    recorded = session_event["inputs"][0]
    assert recorded["path"] == str(data.resolve()) and recorded["name"] == "sales.csv"
    assert len(recorded["sha256"]) == 64 and recorded["size"] == SALES.stat().st_size


@pytest.mark.parametrize(
    "inputs,words",
    [
        (lambda d: [d / "a" / "x.csv", d / "b" / "x.csv"], "two inputs are named x.csv"),
        (lambda d: ["/dev/null"], "is not a regular file"),
        (lambda d: [d / "a"], "is not a regular file"),
        (lambda d: [d / "missing.csv"], "does not exist"),
    ],
)
def test_bad_inputs_are_refused_before_anything_starts(tmp_path, inputs, words):
    from sandcell.sandbox import InputError

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.csv").write_text("a\n1\n")
    with pytest.raises(InputError, match=words):
        agent(dead_url()).session(inputs(tmp_path), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before the session folder was made


def test_reset_forgets_history_and_answers_and_is_traced(tmp_path):
    script = ["Final Answer: 12 rows.", "Final Answer: 12 rows."]
    with (
        ScriptedServer(script) as server,
        agent(server.url, protocol="react").session([SALES], tmp_path) as session,
    ):
        assert session.ask("Rows?").answered
        session.reset()
        again = session.ask("Rows?")
    # the same answer again is no "repeated answer" after a reset: the earlier one is forgotten
    assert again.answered and not again.warnings
    assert [m["role"] for m in server.requests[1]["messages"]] == ["system", "user"]
    kinds = [e["type"] for e in read_trace(again.trace_path)]
    assert kinds.count("reset") == 1 and kinds.index("reset") < len(kinds) - 3
    assert json.dumps(server.requests[1]).count("Rows?") == 1


# -- tool_choice "required": the data is looked at before anything is claimed about it ---------

CALC = {"tool_calls": [call("calculator", expression="6 * 2")]}


@pytest.mark.parametrize("protocol", ["tools", "auto"])
def test_with_input_files_each_questions_first_request_requires_a_tool(tmp_path, protocol):
    with ScriptedServer([CALC, "It has 12 rows.", CALC, "Still 12."]) as server:
        a = agent(server.url, protocol=protocol)
        with a.session([SALES], tmp_path) as session:
            assert session.ask("How many rows?").answered
            assert session.ask("And now?").answered
    assert [r["tool_choice"] for r in server.requests] == ["required", "auto"] * 2
    steps = [e for e in read_trace(tmp_path / "trace.jsonl") if e["type"] == "step"]
    assert [s.get("tool_choice") for s in steps] == ["required", None] * 2
    assert no_sandbox_started(tmp_path / "trace.jsonl")


def test_without_input_files_or_in_react_no_tool_is_required(tmp_path):
    with ScriptedServer([CALC, "It is 12."]) as server:
        assert agent(server.url, protocol="tools").run("What is 6 * 2?", [], tmp_path).answered
    with ScriptedServer(["Final Answer: 12 rows."]) as react:
        assert agent(react.url, protocol="react").run("Rows?", [SALES], tmp_path / "r").answered
    assert [r["tool_choice"] for r in server.requests] == ["auto", "auto"]
    assert "tool_choice" not in react.requests[0] and "tools" not in react.requests[0]


def test_an_endpoint_refusing_required_is_asked_without_it_for_the_rest_of_the_session(tmp_path):
    """llama-cpp-python's chatml-function-calling fails "required" with an empty HTTP 500."""
    refusal = {"error": 500, "message": ""}
    with (
        ScriptedServer([refusal, CALC, "It has 12 rows.", "Still 12."]) as server,
        agent(server.url, protocol="tools").session([SALES], tmp_path) as session,
    ):
        assert session.ask("How many rows?").answered
        assert session.ask("And now?").answered
    assert [r["tool_choice"] for r in server.requests] == ["required", "auto", "auto", "auto"]


def test_a_reply_still_streaming_at_the_wall_time_ends_the_question(tmp_path):
    """A slow model writing a long reply: the question ends at its wall time, not when the
    reply does, and the reply is not asked for again."""
    # the whole reply would take 30 s: the bound below tells the wall from the reply's end
    slow = {"content": "Thought: " + "and then " * 100, "chunk_delay": 0.1, "chunk_size": 3}
    with ScriptedServer([slow, "never"]) as server:
        result = agent(server.url, Rules(wall_s=1.0), protocol="react").run("x", [], tmp_path)
    assert result.stop_reason == "wall_time" and result.duration_s < 10, result.duration_s
    assert len(server.requests) == 1 and server.left() == 1
    final = next(e for e in read_trace(result.trace_path) if e["type"] == "final")
    assert final["stop_reason"] == "wall_time"


def test_a_forced_answer_still_streaming_at_the_wall_time_ends_the_question(tmp_path):
    slow = {"content": "The answer is " + "very " * 150, "chunk_delay": 0.1, "chunk_size": 3}
    with ScriptedServer([CALC, slow, "never"]) as server:
        rules = Rules(max_steps=1, wall_s=1.0)
        result = agent(server.url, rules, protocol="tools").run("x", [], tmp_path)
    assert result.stop_reason == "max_steps" and result.answer is None
    assert "wall_time" in result.error and result.duration_s < 10, result.duration_s
    assert len(server.requests) == 2 and server.left() == 1


def test_an_unstreamed_reply_still_awaited_at_the_wall_time_ends_the_question(tmp_path):
    """A tool call the server answers only unstreamed: nothing streams to check the wall time
    on, so the wait itself ends there."""
    with ScriptedServer([{"drop": "eof"}, {"delay": 30, **CALC}, "never"]) as server:
        result = agent(server.url, Rules(wall_s=1.5), protocol="tools").run("x", [], tmp_path)
    assert result.stop_reason == "wall_time" and result.duration_s < 10, result.duration_s
    assert server.left() == 1


def test_a_server_busy_with_an_earlier_request_is_waited_for_only_until_the_wall_time(tmp_path):
    """A busy server may hold the connection open with nothing to read for minutes; the read
    timeout of each request is cut to the time the question has left."""
    with ScriptedServer([{"delay": 30, "content": "late"}, "never"]) as server:
        result = agent(server.url, Rules(wall_s=1.5), protocol="react").run("x", [], tmp_path)
    assert result.stop_reason == "wall_time" and result.duration_s < 10, result.duration_s
    assert len(server.requests) == 1
