"""Stop rules, the context budget, the trace writer and the notebook export, on plain inputs."""

import json
import subprocess
import sys
import time

import nbformat
import pytest

from sandcell.agent import context
from sandcell.agent.events import Event
from sandcell.agent.prompts import system_prompt
from sandcell.agent.records.notebook import export_notebook, trace_to_notebook
from sandcell.agent.records.replay import recorded_cells
from sandcell.agent.records.trace import TraceWriter, read_trace
from sandcell.agent.seams import Action, LimitReached
from sandcell.agent.stops import FAILURES, MAX_STEPS, REPEATED, TOKENS, WALL_TIME, Rules, Watch
from sandcell.sandbox import Execution
from sandcell.sandbox.execution import ExecutionError, Result, StreamChunk

# -- stop rules ------------------------------------------------------------------------------------


def test_max_steps_fires_after_the_limit_and_asks_for_a_forced_answer():
    watch = Watch(Rules(max_steps=2))
    watch.before_call()
    watch.before_call()
    with pytest.raises(LimitReached) as stop:
        watch.before_call()
    assert stop.value.reason == MAX_STEPS and stop.value.force_answer


def test_repeated_action_warns_once_then_stops():
    watch = Watch(Rules())
    key = Action("python", '{"code": "df.head()"}').key()
    assert watch.action(key) is None
    assert "already ran exactly this action" in watch.action(
        Action("python", {"code": "df.head()"}).key()
    )
    with pytest.raises(LimitReached) as stop:
        watch.action(key)
    assert stop.value.reason == REPEATED and not stop.value.force_answer


def test_consecutive_failures_reset_by_a_success():
    watch = Watch(Rules(max_failures=3))
    watch.failed("a")
    watch.failed("b")
    watch.succeeded()
    watch.failed("c")
    watch.failed("d")
    with pytest.raises(LimitReached) as stop:
        watch.failed("KeyError: 'x'")
    assert stop.value.reason == FAILURES and "KeyError" in stop.value.detail


def test_wall_clock_and_token_budgets():
    watch = Watch(Rules(wall_s=0.05))
    watch.before_call()
    time.sleep(0.06)
    with pytest.raises(LimitReached, match=WALL_TIME):
        watch.before_call()
    watch = Watch(Rules(token_budget=100))
    watch.spent(101)
    with pytest.raises(LimitReached, match=TOKENS):
        watch.before_call()


def test_repeated_thought_warns_once():
    watch = Watch(Rules())
    thought = "I should load the CSV file and look at the columns"
    assert watch.thought(thought) is None
    assert "repeats an earlier one" in watch.thought("  " + thought.upper())
    assert watch.thought(thought) is None  # warned once only
    assert watch.thought("short") is None


@pytest.mark.parametrize(
    "answer",
    [
        "",
        "   ",
        "I cannot determine that.",
        "Sorry, I don't know.",
        "无法确定。",
        "How many rows?",
        "42 rows",
    ],
)
def test_answer_quality_gate_nudges_once(answer):
    watch = Watch(Rules(quality_retries=1))
    nudge = watch.check_answer(answer, "How many rows?", earlier=["42 rows"])
    assert nudge is not None and "Final Answer" in nudge
    assert (
        watch.check_answer(answer, "How many rows?", earlier=["42 rows"]) is None
    )  # one retry only


def test_answer_quality_gate_accepts_real_answers():
    watch = Watch(Rules())
    assert (
        watch.check_answer("There are 12 rows; North sold the most.", "How many rows?", []) is None
    )
    long_negative = "I cannot find any row for 2023: " + "the data covers 2024 only. " * 20
    assert watch.check_answer(long_negative, "Any 2023 rows?", []) is None


# -- context budget --------------------------------------------------------------------------------


def _history(steps: int, obs_chars: int) -> list[dict]:
    messages = [{"role": "system", "content": "S" * 500}, {"role": "user", "content": "the task"}]
    for i in range(steps):
        messages.append(
            {"role": "assistant", "content": f"Thought: step {i}\n```python\nprint({i})\n```"}
        )
        body = f"line one of step {i}\n" + "x" * obs_chars + f"\nKeyError: 'col{i}'"
        messages.append({"role": "user", "content": f"Observation: {body}"})
    return messages


def test_fit_compacts_oldest_observations_and_keeps_newest_steps_whole():
    messages = _history(8, 3000)
    before = [dict(m) for m in messages]
    compacted = context.fit(messages, budget_chars=12_000, keep_recent=3)
    assert compacted >= 1 and context.size(messages) <= 12_000
    assert messages[0] == before[0] and messages[1] == before[1]  # system prompt and task whole
    assert messages[-6:] == before[-6:]  # the newest three steps whole
    old = messages[3]["content"]
    assert old.startswith("Observation: [compacted] KeyError: 'col0'") and len(old) < 250
    assert [m["role"] for m in messages] == [m["role"] for m in before]


def test_fit_leaves_a_small_history_alone_and_tool_pairs_intact():
    messages = _history(2, 10)
    assert context.fit(messages, budget_chars=100_000) == 0
    tool_history = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function",
                                                              "function": {"name": "python", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "y" * 5000},
        *[{"role": "assistant", "content": "t"}, {"role": "user", "content": "Observation: z"}] * 3,
    ]  # fmt: skip
    context.fit(tool_history, budget_chars=1000, keep_recent=3)
    assert tool_history[3]["tool_call_id"] == "a" and tool_history[3]["content"].startswith(
        "[compacted]"
    )


def test_system_prompt_is_lean_and_never_mentions_the_step_limit():
    text = system_prompt("/data/a.csv: csv, 3 rows", "")
    assert "/data/a.csv" in text and "Today is" in text
    # the tools describe themselves (tool definitions or the ReAct block): not repeated here
    assert "calculator" not in text and "Look a code up" not in text
    assert "step" not in text.lower() and len(text) < 600


# -- trace and notebook ---------------------------------------------------------------------------


def record(trace: TraceWriter, type_: str, **fields: object) -> None:
    """A record as an older version of the trace had it, through the typed events."""
    trace.write(Event.from_json({"type": type_, **fields}))


def test_trace_lines_are_on_disk_as_soon_as_written(tmp_path):
    path = tmp_path / "trace.jsonl"
    trace = TraceWriter(path)
    record(trace, "step", step=1, observations=[])
    # another process reads it while the writer is still open
    out = subprocess.run(
        [sys.executable, "-c", f"print(open({str(path)!r}).read())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out.strip())["step"] == 1
    trace.close()


def test_read_trace_skips_a_last_line_cut_by_a_crash(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"type": "step", "step": 1}\n{"type": "step", "st')
    assert read_trace(path) == [{"type": "step", "step": 1}]


def test_a_writer_cuts_a_torn_last_line_before_appending(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"type": "session"}\n{"type": "step", "st')  # a kill mid-write
    with TraceWriter(path) as trace:  # a restarted server takes the session up again
        record(trace, "session")
    assert [e["type"] for e in read_trace(path)] == ["session", "session"]


def test_a_trace_line_that_is_not_an_object_is_not_a_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"type": "session"}\n[1, 2]\n')
    with pytest.raises(ValueError, match="not an object"):
        read_trace(path)


def test_replay_cells_know_what_was_stopped_and_how_long_each_took():
    ran = Execution(code="x = 1", duration_s=3.5)
    stopped = Execution(code="while True: pass", interrupted=True)
    restarted = Execution(code="while True: pass", timed_out=True, restarted=True)
    step = {"type": "step", "question": 1, "step": 1, "observations": [
        {"tool": "python", "execution": e.to_dict()} for e in (ran, stopped, restarted)]}  # fmt: skip
    cells = recorded_cells([Event.from_json({"type": "session"}), Event.from_json(step)])
    assert [(c.stopped, c.restarted) for c in cells] == [
        (False, False),
        (True, False),
        (True, True),
    ]
    assert cells[0].duration_s == 3.5


def test_a_later_session_event_shows_in_the_notebook_only_when_it_did_something():
    events = [
        {"type": "session", "model": "m", "inputs": []},
        {"type": "session", "model": "m2", "inputs": []},  # only looked at after a restart
        {"type": "session", "model": "m3", "inputs": []},
        {"type": "question", "question": 1, "task": "go on"},
    ]
    text = "\n".join(c.source for c in trace_to_notebook(list(map(Event.from_json, events))).cells)
    assert text.count("continued here") == 1 and "`m3`" in text and "`m2`" not in text


def test_notebook_has_thoughts_code_outputs_and_images(tmp_path):
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    ex = Execution(
        code="print('hi')\nplot()\n1+1",
        stream=[StreamChunk("stdout", "hi\n")],
        results=[Result({"image/png": png, "text/plain": "<Figure>"}, {"sandcell/path": "/workspace/a.png"}),
                 Result({"text/plain": "2"}, is_main=True)],
        execution_count=1,
    )  # fmt: skip
    failed = Execution(
        code="df['x']",
        error=ExecutionError("KeyError", "'x'", ["KeyError: 'x'"]),
        execution_count=2,
    )
    path = tmp_path / "trace.jsonl"
    with TraceWriter(path) as trace:
        record(trace, "session", model="m", protocol="react", inputs=["/tmp/sales.csv"])
        record(trace, "question", question=1, task="What is 1+1?")
        record(trace, "step", thought="Compute it.", observations=[
            {"tool": "python", "args": {"code": ex.code}, "ok": True, "text": "hi", "execution": ex.to_dict()},
            {"tool": "calculator", "args": {"expression": "1+1"}, "ok": True, "text": "2", "execution": None},
        ])  # fmt: skip
        record(trace, "step", thought="", observations=[
            {"tool": "python", "args": {}, "ok": False, "text": "KeyError", "execution": failed.to_dict()}])  # fmt: skip
        record(trace, "final", answer="2", stop_reason="answered")
    nb = nbformat.read(str(export_notebook(path, tmp_path / "nb.ipynb")), as_version=4)
    nbformat.validate(nb)
    kinds = [c.cell_type for c in nb.cells]
    assert kinds == ["markdown", "markdown", "markdown", "code", "markdown", "code", "markdown"]
    code = nb.cells[3]
    assert code.source == ex.code and code.execution_count == 1
    assert [o.output_type for o in code.outputs] == ["stream", "display_data", "execute_result"]
    assert code.outputs[1].data["image/png"] == png
    assert nb.cells[5].outputs[0].ename == "KeyError"
    assert "**Answer:** 2" in nb.cells[-1].source


@pytest.mark.timeout(10)
def test_the_system_prompt_names_the_hosts_the_sandbox_may_reach_or_says_there_is_no_network():
    sealed = system_prompt("", "")
    assert "(no network; state persists)" in sealed
    named = system_prompt("", "", allow_net=("data.example.org", "internal:intra.lan:8080"))
    assert "(network: only HTTP(S) to data.example.org, intra.lan:8080, through its " \
        "proxy; state persists)" in named  # fmt: skip
    assert "no network" not in named
