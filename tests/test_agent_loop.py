"""The agent end to end: the real openai client over HTTP to the scripted server, the real
tool registry, the real Docker sandbox. Replies that depend on what the sandbox computed are
written by callables from the observation the agent sent, so a wrong computation fails."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from sandcell import Agent, OpenAIModel, Rules
from sandcell.agent import prompts
from sandcell.agent.events import Final, Observation, Token
from sandcell.agent.records.trace import read_trace
from tests.cli_runner import sandcell
from tests.scripted_server import ScriptedServer

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

DATA = Path(__file__).parent / "data" / "agent"
SALES = DATA / "sales.csv"
LOAD = "import pandas as pd\ndf = pd.read_csv('/data/sales.csv')\n"


def agent(server, rules=None, **kw):
    model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
    return Agent(model, rules=rules or Rules(), **kw)


def last_observation(body: dict) -> str:
    for m in reversed(body["messages"]):
        text = m["content"] or ""
        if isinstance(text, list):  # an observation with the cell's figures (--vision)
            text = "".join(p["text"] for p in text if p["type"] == "text")
        if m["role"] == "tool" or (m["role"] == "user" and text.startswith("Observation:")):
            return text.removeprefix("Observation: ")
    raise AssertionError("no observation in the request")


def call(name, **args):
    return {"name": name, "arguments": args}


def truth():
    df = pd.read_csv(SALES)
    revenue = (df.units * df.unit_price).groupby(df.region).sum()
    return revenue.idxmax(), round(revenue.max(), 2), len(df)


# -- a multi-step question answered correctly, in both protocols ------------------------------------------


def test_multi_step_csv_question_text_react_via_auto_fallback(tmp_path):
    best, value, _ = truth()
    script = [
        "Thought: I'll load the file and check its size first.\n```python\n"
        + LOAD
        + "print(df.shape)\n```\n"
        "Observation: (3, 5)\nFinal Answer: made up",
        "Thought: Now revenue per region.\nAction: python\nAction Input: "
        + json.dumps(
            {
                "code": "df['revenue'] = df.units * df.unit_price\nr = df.groupby('region').revenue.sum()\n"
                "print(r.idxmax(), round(r.max(), 2))"
            }
        ),
        lambda body: (
            "Thought: I have the result.\nFinal Answer: {} had the highest revenue, {}.".format(
                *last_observation(body).split()
            )
        ),
    ]
    events = []
    with ScriptedServer(script, reject_tools=True) as server:
        result = agent(server, on_event=events.append).run(
            "Which region had the highest revenue?", inputs=[SALES], output_dir=tmp_path
        )
    assert result.answered, result
    assert result.answer == f"{best} had the highest revenue, {value}."
    assert result.steps == 3 and result.usage.total > 0
    first, *rest = server.requests
    assert first["tools"]  # auto tried native tools, the endpoint refused, then text ReAct
    assert all("tools" not in r and r["stop"][0] == "\nObservation:" for r in rest)
    assert "Action Input" in rest[0]["messages"][0]["content"]  # the react instructions
    assert (
        "/data/sales.csv" in rest[0]["messages"][0]["content"]
        and "unit_price" in rest[0]["messages"][0]["content"]
    )
    # the invented observation was cut off by the stop sequence and never reached the history
    assert last_observation(rest[1]).startswith("(12, 5)")
    assert "made up" not in json.dumps(rest[1]["messages"])
    tokens = "".join(e.text for e in events if isinstance(e, Token))
    assert "Final Answer" in tokens and sum(isinstance(e, Observation) for e in events) == 2
    # each fact once: the final answer reaches the front end as the one Final the trace has
    assert [e.answer for e in events if isinstance(e, Final)] == [result.answer]
    assert isinstance(events[-1], Final) and events[-1].to_json() == {
        k: v for k, v in read_trace(result.trace_path)[-1].items() if k != "time"
    }


def test_multi_step_csv_question_native_tool_calls_several_per_reply(tmp_path):
    best, value, rows = truth()
    script = [
        {"content": "Looking at the data.", "tool_calls": [
            call("python", code=LOAD + "print(len(df))"), call("calculator", expression="12 * 3"),
            call("file_metadata", path="/data/sales.csv")]},
        {"tool_calls": [call("python", code="r = (df.units * df.unit_price).groupby(df.region).sum()\n"
                                           "print(r.idxmax(), round(r.max(), 2))")]},
        lambda body: "The best region is {} with revenue {}.".format(*last_observation(body).split()),
    ]  # fmt: skip
    with ScriptedServer(script) as server:
        result = agent(server, protocol="tools").run(
            "Best region by revenue?", inputs=[SALES], output_dir=tmp_path
        )
    assert result.answer == f"The best region is {best} with revenue {value}."
    second = server.requests[1]["messages"]
    tool_msgs = [m for m in second if m["role"] == "tool"]
    calls = next(m for m in second if m.get("tool_calls"))["tool_calls"]
    assert [m["tool_call_id"] for m in tool_msgs] == [c["id"] for c in calls]  # answered in order
    assert tool_msgs[0]["content"].strip() == str(rows)
    assert tool_msgs[1]["content"].strip() == "36"
    assert "unit_price" in tool_msgs[2]["content"]
    assert all(r["tools"] and "stop" not in r for r in server.requests)


# -- every malformed reply recovered -------------------------------------------------------------------------


def test_every_malformed_reply_is_recovered(tmp_path):
    script = [
        "The data probably has 12 rows.",  # prose without a label
        "",  # empty
        'Thought: count\nAction: python\nAction Input: {"code": "'
        + LOAD.replace("\n", "\\n")
        + 'print(len(df))",',
        'Thought: search\nAction: web_search\nAction Input: {"query": "sales"}',  # unknown tool
        {
            "content": "Thought: long\n```python\nprint('never run')\nfor i in range(",
            "finish_reason": "length",
        },
        'Thought: x\nAction: python\nAction Input: {"code": "df[\'nope\']"}',  # raises KeyError
        "Thought: try calc\nAction: calculator\nAction Input: {{{",  # unrepairable, one-string tool
        "Thought: done\nFinal Answer: There are 12 rows.",
    ]
    with ScriptedServer(script) as server:
        result = agent(server, protocol="react").run(
            "How many rows?", inputs=[SALES], output_dir=tmp_path
        )
    assert result.answered and result.answer == "There are 12 rows.", result
    feedback = [r["messages"][-1]["content"] for r in server.requests[1:]]
    assert "Final Answer:" in feedback[0] and feedback[0].endswith(prompts.UNLABELLED)
    assert "empty" in feedback[1]
    assert feedback[2] == "Observation: 12"  # the broken JSON was repaired and run
    assert (
        "unknown tool `web_search`" in feedback[3]
        and "python" in feedback[3]
        and "calculator" in feedback[3]
    )
    assert feedback[4] == prompts.LENGTH_NUDGE
    assert "KeyError" in feedback[5]
    assert "{{{" in feedback[6]
    steps = [e for e in read_trace(result.trace_path) if e["type"] == "step"]
    assert len(steps) == 8 and steps[4]["error"] == "cut by the length limit"
    assert "never run" not in json.dumps([s.get("observations") for s in steps])


def test_quality_gate_and_unlabelled_answers_in_one_session(tmp_path):
    script = [
        "Final Answer: I cannot determine that.",
        "Final Answer: The file has 12 rows.",
        "It has 5 columns.",  # no label: nudged once
        "It has 5 columns: date, region, product, units and unit_price.",  # again: taken as the answer
    ]
    with (
        ScriptedServer(script) as server,
        agent(server, protocol="react").session([SALES], tmp_path) as s,
    ):
        first = s.ask("How many rows?")
        second = s.ask("How many columns?")
    assert first.answered and first.answer == "The file has 12 rows." and first.warnings
    assert "does not answer the question" in server.requests[1]["messages"][-1]["content"]
    assert second.answered and second.answer.startswith("It has 5 columns: date")
    assert server.requests[2]["messages"][1]["content"] == "How many rows?"  # one shared history


# -- stop conditions -------------------------------------------------------------------------------------------


def test_repeated_action_warned_then_stopped(tmp_path):
    same = {"tool_calls": [call("python", code="print(df.shape)")]}
    with ScriptedServer([{"tool_calls": [call("python", code=LOAD)]}, same, same, same]) as server:
        result = agent(server, protocol="tools").run("Shape?", inputs=[SALES], output_dir=tmp_path)
    assert result.stop_reason == "repeated_action" and result.answer is None
    assert "already ran exactly this action" in last_observation(server.requests[3])
    assert len(server.requests) == 4 and server.left() == 0


def test_max_steps_then_one_forced_answer_without_tools(tmp_path):
    script = [
        {"tool_calls": [call("python", code=LOAD)]},
        {"tool_calls": [call("python", code="print(len(df))")]},
        {"tool_calls": [call("python", code="print(df.units.sum())")]},
        {"content": "Final Answer: 12 rows and 102 units in all."},
    ]
    with ScriptedServer(script) as server:
        result = agent(server, Rules(max_steps=3), protocol="tools").run(
            "Summarise", [SALES], tmp_path
        )
    assert result.stop_reason == "max_steps" and result.steps == 3
    assert result.answer == "12 rows and 102 units in all."
    forced = server.requests[3]
    assert (
        forced["tool_choice"] == "none"
        and forced["messages"][-1]["content"] == prompts.FORCED_ANSWER
    )
    assert (
        "3" not in forced["messages"][0]["content"].split("Today is")[0]
    )  # the limit is never told
    assert "102" in last_observation(forced)


def test_context_compaction_keeps_system_task_and_newest_steps_whole(tmp_path):
    script = [{"tool_calls": [call("python", code=f"print({i}, 'y' * 1500)")]} for i in range(5)]
    script += ["Final Answer: printed", "never asked"]
    with ScriptedServer(script) as server:
        rules = Rules(context_chars=6000, keep_recent=2)
        result = agent(server, rules, protocol="tools").run("Print things", [SALES], tmp_path)
    assert result.answered and server.left() == 1
    last = server.requests[5]["messages"]
    tool_msgs = [m["content"] for m in last if m["role"] == "tool"]
    assert tool_msgs[0].startswith("[compacted] 0 yyy") and len(tool_msgs[0]) < 250
    assert [len(t) > 1500 for t in tool_msgs] == [False, False, False, True, True]  # newest 2 whole
    assert last[0]["role"] == "system" and "sales.csv" in last[0]["content"]
    assert last[1]["content"] == "Print things"
    assert (
        sum(len(m.get("content") or "") for m in last) < 6000 + 1600
    )  # within budget before the reply


# -- traces, notebooks, sessions, replay ---------------------------------------------------------------------


def test_session_shares_kernel_state_exports_notebook_files_and_replays(tmp_path):
    plot = (LOAD + "df['revenue'] = df.units * df.unit_price\n"
            "by = df.groupby('region').revenue.sum().round(2)\nby.to_csv('/workspace/output/by_region.csv')\n"
            "import matplotlib.pyplot as plt\nby.plot.bar()\nplt.savefig('/workspace/output/revenue.png')\nplt.show()\n"
            "print(by.to_dict())")  # fmt: skip
    script = [
        {"tool_calls": [call("python", code=plot)]},
        lambda body: "Revenue by region: " + last_observation(body).split("\n")[0],
        {
            "tool_calls": [call("python", code="print(round(df.revenue.sum(), 2))")]
        },  # df from question 1
        lambda body: "Total revenue: " + last_observation(body).strip(),
    ]
    out = tmp_path / "session"
    with ScriptedServer(script) as server, agent(server).session([SALES], out) as s:
        first = s.ask("Revenue by region, with a chart and a CSV?")
        second = s.ask("And the total?")
    df = pd.read_csv(SALES)
    assert second.answer == f"Total revenue: {round((df.units * df.unit_price).sum(), 2)}"
    # what the code saved under output/, and the chart it showed, under figures/
    assert sorted(str(Path(f).relative_to(out)) for f in second.files) == [
        "figures/figure-1.png", "output/by_region.csv", "output/revenue.png"]  # fmt: skip
    assert (out / "output" / "revenue.png").read_bytes()[:4] == b"\x89PNG"
    nb = nbformat.read(str(second.notebook_path), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.source for c in code] == [plot, "print(round(df.revenue.sum(), 2))"]
    assert any("image/png" in o.get("data", {}) for o in code[0].outputs)
    assert first.trace_path == second.trace_path and "Question 2" in json.dumps(nb.cells[-3:])

    done = sandcell("replay", str(first.trace_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 cells replayed, 2 same, 0 differ" in done.stdout
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text(first.trace_path.read_text().replace("'South': 151.95", "'South': 999.0"))
    done = sandcell("replay", str(tampered))
    assert done.returncode == 1 and "cell 1 (question 1, step 1) differs" in done.stdout
    assert "+{'East': 105.5, 'North': 141.9, 'South': 151.95}" in done.stdout


def test_replay_resets_where_the_session_did_and_warns_of_a_changed_input(tmp_path):
    data = tmp_path / "sales.csv"
    data.write_bytes(SALES.read_bytes())
    script = [
        {"tool_calls": [call("python", code="x = 41\nprint(x + 1)")]},
        "Final Answer: 42",
        {"tool_calls": [call("python", code="print('x' in dir())")]},
        "Final Answer: x is gone",
    ]
    with ScriptedServer(script) as server, agent(server).session([data], tmp_path / "s") as s:
        s.ask("Set x")
        s.reset()  # what chat's /reset does
        assert s.ask("Is x there?").answered
    trace = tmp_path / "s" / "trace.jsonl"
    recorded = [
        o["text"].strip()
        for e in read_trace(trace)
        if e["type"] == "step"
        for o in e.get("observations", [])
    ]
    assert recorded == ["42", "False"]  # the kernel was fresh after the reset
    done = sandcell("replay", str(trace))
    assert done.returncode == 0, done.stdout + done.stderr  # replayed with the reset: same
    assert "2 cells replayed, 2 same, 0 differ" in done.stdout and "warning" not in done.stderr
    with data.open("a") as f:
        f.write("2024-02-01,East,widget,1,2.5\n")
    done = sandcell("replay", str(trace))
    assert f"warning: input sales.csv ({data.resolve()}) changed" in done.stderr
    assert done.returncode == 0  # the cells do not read it: their outputs still match


KILLED_RUN = textwrap.dedent(
    """
    from tests.scripted_server import ScriptedServer
    from sandcell import Agent, OpenAIModel
    LOAD = {load!r}
    script = [
        {{"tool_calls": [{{"name": "python", "arguments": {{"code": LOAD + "print(len(df))"}}}}]}},
        {{"tool_calls": [{{"name": "calculator", "arguments": {{"expression": "12*2"}}}}]}},
        {{"tool_calls": [{{"name": "python", "arguments": {{"code": "import time; time.sleep(120)"}}}}]}},
    ]
    with ScriptedServer(script) as server:
        model = OpenAIModel("m", base_url=server.url, api_key="k")
        Agent(model, protocol="tools").run("count", inputs=[{sales!r}], output_dir={out!r})
    """
)


def test_trace_of_a_run_killed_mid_way_holds_every_finished_step(tmp_path):
    code = KILLED_RUN.format(load=LOAD, sales=str(SALES), out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent.parent)
    trace = tmp_path / "trace.jsonl"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # wait for two finished steps, then kill mid-cell
            if trace.exists() and trace.read_text().count('"type": "step"') >= 2:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.1)
        time.sleep(1.0)  # the third step is now inside its 120 s cell
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        _reap()
    events = [e for e in read_trace(trace) if e["type"] != "model_request"]  # one per request
    steps = [e for e in events if e["type"] == "step"]
    # the sandbox event: the first python action waited for the container started beside it
    assert [e["type"] for e in events] == ["session", "question", "sandbox", "step", "step"]
    assert events[2]["start_s"] > 0 and events[2]["waited_s"] >= 0
    assert steps[0]["observations"][0]["text"].strip() == "12"
    assert steps[0]["observations"][0]["execution"]["code"].endswith("print(len(df))")
    assert steps[1]["observations"][0]["text"].strip() == "24"
    assert re.fullmatch(r"\d{4}-.*", steps[1]["time"])


def _reap():
    """The killed run's container: remove it now rather than at the next sandbox start."""
    from sandcell.sandbox.container import engine, reap_orphans

    reap_orphans(engine())


# -- the sandbox starts beside the first model request ----------------------------------------


def test_sandbox_starts_in_the_background_and_the_first_action_waits_for_it(tmp_path):
    script = [
        {"delay": 1.5, "tool_calls": [call("python", code="print(6 * 7)")]},
        lambda body: "Final Answer: " + last_observation(body).strip(),
    ]
    with ScriptedServer(script) as server:
        result = agent(server, protocol="tools").run("6 x 7?", [SALES], tmp_path)
    assert result.answer == "42"
    events = read_trace(result.trace_path)
    kinds = [e["type"] for e in events]
    # the model's request ends (its record), then the action waits for the sandbox
    assert kinds[:5] == ["session", "question", "model_request", "sandbox", "step"]
    request = events[2]  # answered: no error; its usage (estimated: a scripted server)
    assert request["duration_s"] >= 1.5 and "error" not in request and request["input_tokens"] > 0
    question, sandbox = events[1], events[3]
    assert sandbox["started_at"] <= question["time"]  # begun before the model was asked
    # the model took 1.5 s; the container started meanwhile, so the action waited less
    assert sandbox["waited_s"] < sandbox["start_s"]


def test_a_session_closed_while_its_sandbox_starts_leaves_no_container(tmp_path):
    from tests.containers import container_labels, owner_label

    with ScriptedServer([]) as server:
        session = agent(server).session([SALES], tmp_path)
        session.close()  # at once: the container is still starting
    assert container_labels(owner_label(os.getpid())) == []
    sandbox = [e for e in read_trace(tmp_path / "trace.jsonl") if e["type"] == "sandbox"]
    assert sandbox[0]["used"] is False and sandbox[0]["started_at"]
