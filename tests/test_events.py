"""The typed event stream (agent/events.py): every event type round-trips through its JSON,
and a trace written before the types existed (tests/data/trace-v1, made by
tests/data/trace-v1/make_fixture.py with the code of that time) still exports, replays and
resumes."""

from __future__ import annotations

import json
import shutil
import types
import typing
from dataclasses import fields
from pathlib import Path

import nbformat
import pytest

from sandcell.agent.events import REGISTRY, Event, Final, SessionStarted, Step, UnknownEvent
from sandcell.agent.model.scripted import ScriptedModel
from sandcell.agent.records.notebook import export_notebook
from sandcell.agent.records.replay import replay
from sandcell.agent.records.trace import read_trace
from sandcell.sandbox import Execution, Limits
from sandcell.sandbox.execution import ExecutionError, Result, StreamChunk

FIXTURE = Path(__file__).parent / "data" / "trace-v1"
SESSION = next(FIXTURE.glob("alice/*/trace.jsonl")).parent  # DATA/<user>/<id>/


def sample(hint: object) -> object:
    """A value of a field's type: every event class is built from its annotations, so a
    class added later is round-tripped without anyone listing it here."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in typing.get_args(hint) if a is not type(None)))
    if origin is list or hint is list:
        return [{"name": "a.csv", "path": "/tmp/a.csv", "n": [1, 2]}]
    if origin is dict or hint is dict:
        return {"key": {"nested": [1, "two", None]}}
    if hint is Execution:
        return Execution(
            code="print(1)\n2",
            stream=[StreamChunk("stdout", "1\n")],
            results=[Result({"text/plain": "2"}, is_main=True)],
            error=ExecutionError("KeyError", "'x'", ["KeyError: 'x'"]),
            execution_count=3,
            duration_s=0.25,
        )
    values = {int: 7, float: 1.5, bool: True, str: "text é"}
    if hint in values:
        return values[hint]
    raise AssertionError(f"add a sample value for {hint!r} to this test")


def built(cls: type[Event]) -> Event:
    hints = typing.get_type_hints(cls, vars(__import__(cls.__module__, fromlist=["x"])))
    own = [f for f in fields(cls) if f.name not in ("time", "extra")]
    return cls(**{f.name: sample(hints[f.name]) for f in own}, time="2026-01-01T00:00:00Z")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cls", sorted(REGISTRY.values(), key=lambda c: c.tag), ids=lambda c: c.tag)
def test_every_event_type_round_trips_through_its_json(cls):
    event = built(cls)
    data = event.to_json()
    assert data["type"] == cls.tag and data["time"] == "2026-01-01T00:00:00Z"
    assert Event.from_json(data) == event
    assert type(Event.from_json(data)) is cls


@pytest.mark.timeout(30)
def test_the_registry_holds_every_event_class_once():
    def subclasses(cls: type) -> set[type]:
        return {c for s in cls.__subclasses__() for c in {s} | subclasses(s)}

    assert {c for c in subclasses(Event) if c is not UnknownEvent} == set(REGISTRY.values())
    assert len(REGISTRY) >= 17


@pytest.mark.timeout(30)
def test_unknown_types_and_fields_are_kept_and_missing_fields_read_as_none():
    newer = {"type": "check_run", "time": "t", "passed": True}
    event = Event.from_json(newer)
    assert isinstance(event, UnknownEvent) and event.to_json() == newer
    final = Event.from_json({"type": "final", "answer": "2", "stop_reason": "answered", "new": 1})
    assert isinstance(final, Final) and final.answer == "2" and final.steps is None
    assert final.extra == {"new": 1} and final.to_json()["new"] == 1
    step = Step(question=1, step=2, thought="")
    assert step.to_json() == {"type": "step", "question": 1, "step": 2, "thought": ""}


@pytest.mark.timeout(30)
def test_a_trace_from_before_the_event_types_reads_back_whole():
    raw = read_trace(SESSION / "trace.jsonl")
    events = [Event.from_json(d) for d in raw]
    assert not [e for e in events if isinstance(e, UnknownEvent)]
    for data, event in zip(raw, events, strict=True):
        written = event.to_json()
        # the same fields, but a step's `nudge: null` (left out now: it did not apply)
        assert {k: v for k, v in data.items() if v is not None or k != "nudge"} == written
    tags = [d["type"] for d in raw]
    for tag in ("session", "sandbox", "inputs", "question", "step", "final", "sandbox_released",
                "reset", "rebuilt"):  # fmt: skip
        assert tag in tags
    assert isinstance(events[0], SessionStarted)
    assert [i["name"] for i in events[0].input_items()] == []


@pytest.mark.timeout(60)
def test_the_old_trace_exports_to_a_notebook(tmp_path):
    nb = nbformat.read(
        str(export_notebook(SESSION / "trace.jsonl", tmp_path / "nb.ipynb")), as_version=4
    )
    nbformat.validate(nb)
    text = "\n".join(c.source for c in nb.cells)
    for said in ("# sandcell session", "*Inputs added: `/data/sales.csv`.*", "## Question 3",
                 "**Answer:** 7 units", "kernel was reset here", "continued here",
                 "rebuilt here by re-running the 2 cell(s)", "`calculator` `{\"expression\": \"7 * 2\"}`"):  # fmt: skip
        assert said in text, said
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 3 and "read_csv('/data/sales.csv')" in code[0].source
    assert code[0].outputs[0].text == "7\n"


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_the_old_trace_replays_cell_for_cell():
    done = replay(SESSION / "trace.jsonl", [SESSION / "inputs" / "sales.csv"])
    assert len(done.cells) == 3 and all(c.same for c in done.cells), done.cells
    assert [c.reset_before for c in done.cells] == [True, False, True]  # two idle releases
    assert done.changed == []


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_a_server_resumes_the_old_session(tmp_path):
    from sandcell.agent.serve import ServeConfig
    from tests.serve_helpers import USERS, client, execute, serving

    data = tmp_path / "d"
    shutil.copytree(FIXTURE / "alice", data / "alice")
    sid = SESSION.name
    model = ScriptedModel(["Final Answer: four"], name="scripted")
    cfg = ServeConfig(model=model, users=USERS, data=data, pool=0, limits=Limits(timeout_s=30))
    with serving(cfg) as base, client(base) as api:
        listed = {s["id"]: s for s in api.get("/api/sessions").json()}
        assert listed[sid]["resumed"] and listed[sid]["questions"] == 3
        assert listed[sid]["inputs"] == ["sales.csv"]
        turns = api.get(f"/api/sessions/{sid}/history").json()
        assert [(t["answer"], t["stop_reason"]) for t in turns] == [
            ("7 units", "answered"), ("14", "answered"), ("still 7", "answered")]  # fmt: skip
        r = execute(api, sid, "sorted(os.listdir('/workspace/output'))")  # os: the last cell's
        assert r.json()["results"][0]["data"]["text/plain"] == "['total.txt']", r.json()
        assert "re-running its 3 recorded cell(s)" in r.headers["x-sandcell-warning"]
        notebook = nbformat.reads(api.get(f"/api/sessions/{sid}/notebook").text, as_version=4)
        assert "rebuilt here by re-running the 3 cell(s)" in "\n".join(
            c.source for c in notebook.cells
        )


@pytest.mark.timeout(60)
def test_the_ray_driver_rewrites_only_the_input_paths_of_the_session_record(tmp_path):
    ray_batch = pytest.importorskip("sandcell.agent.jobs.ray_batch")
    from sandcell.agent.jobs.batch import Job
    from sandcell.sandbox import Inputs

    here = tmp_path / "sales.csv"
    here.write_text("region,units\nEast,3\n")
    session = {"type": "session", "time": "t", "model": "m", "max_tokens": None,
               "protocol": "tools", "inputs": [{"name": "sales.csv", "path": "/tmp/node/sales.csv",
               "size": 21, "sha256": "ab"}, "/tmp/node/old-style.csv"], "image": "i",
               "limits": {}, "rules": {}, "sandbox_start": "background", "newer": [1]}  # fmt: skip
    rest = b'{"type": "question", "question": 1, "task": "t"}\n'
    raw = json.dumps(session).encode() + b"\n" + rest
    job = Job("a", "t", Inputs.from_paths([here]))
    out = ray_batch.driver_paths({"trace.jsonl": raw, "other": b"x"}, job)
    head, _, after = out["trace.jsonl"].partition(b"\n")
    assert after == rest and out["other"] == b"x"
    expected = dict(
        session, inputs=[{**session["inputs"][0], "path": str(here)}, session["inputs"][1]]
    )
    assert json.loads(head) == expected
    question_first = rest + raw
    assert (
        ray_batch.driver_paths({"trace.jsonl": question_first}, job)["trace.jsonl"]
        == question_first
    )
