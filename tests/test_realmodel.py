"""sandcell against a server someone else wrote, with a real model: llama-cpp-python's
OpenAI-compatible server and SmolLM2-135M-Instruct (tests/llama_server.py; installed by
scripts/ensure-llama.sh). One server, started with --chat_format chatml-function-calling, serves
`auto`, `tools` and `react` (without tools its prompt is plain ChatML, SmolLM2's own format).

These assert on what sandcell does with the server's real output (stop reasons, the trace, the
notebook, tool-call ids, streaming, the reply cap, requests sent), never on the answers'
quality: a 135M model writes poor code. Seed fixed, temperature 0: the runs repeat."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from pathlib import Path

import nbformat
import pexpect
import pytest

from sandcell import OpenAIModel
from sandcell.agent import stops
from sandcell.agent.records.trace import read_trace
from sandcell.agent.seams import ModelError
from tests.cli_runner import sandcell, sandcell_terminal
from tests.llama_server import MODEL, LlamaServer, missing
from tests.missing import cannot_run

pytestmark = [pytest.mark.realmodel, pytest.mark.xdist_group("realmodel")]

TASK = "What is the total of the column n in /data/numbers.csv?"
WALL = 120  # seconds per question: bounded, with room for a loaded 2-core machine
# every way a question may end here but model_error/sandbox_error: a stop reason, not a crash
ENDED = {stops.ANSWERED, stops.MAX_STEPS, stops.FAILURES, stops.REPEATED, stops.WALL_TIME}


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    problem = missing()
    if problem:
        cannot_run(problem, "realmodel test")
    with LlamaServer(tmp_path_factory.mktemp("llama") / "server.log") as server:
        yield server


# The day the prompt says: SmolLM2-135M's replies turn on every token of it, and on other
# days it wrote broken tool-call JSON where these tests expect a call that runs (2026-12-04).
TODAY = "2026-12-03"


def env() -> dict:
    """The CLI's environment: no reply cap from the user, so sandcell's default applies; the
    prompt's date fixed."""
    drop = ("SANDCELL_MAX_TOKENS", "COLUMNS")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "SANDCELL_TODAY": TODAY}


def numbers(folder: Path) -> Path:
    csv = folder / "numbers.csv"
    csv.write_text("n\n1\n2\n3\n")
    return csv


def endpoint(llama: LlamaServer) -> list[str]:
    return ["--base-url", llama.url, "--model", MODEL, "--api-key", "none"]


def run(llama: LlamaServer, folder: Path, protocol: str, task: str, wall: float, *more: str):
    out = folder / "out"
    command = [
        "run", "--task", task, "--input", str(numbers(folder)), "--output", str(out),
        *endpoint(llama), "--protocol", protocol, "--wall", str(wall), "--timeout", "15",
        "--quiet", *more,
    ]  # fmt: skip
    started = time.monotonic()
    done = sandcell(*command, timeout=wall + 120, env=env())
    return done, out, time.monotonic() - started


def steps_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "step"]


@pytest.mark.docker
@pytest.mark.timeout(WALL + 300)
@pytest.mark.parametrize("protocol", ["auto", "tools"])  # react: the runaway test below
def test_run_ends_with_a_stop_reason_a_complete_trace_and_a_notebook_that_reruns(
    llama, tmp_path, protocol
):
    # A server of its own: a tool call this server can only answer unstreamed ignores
    # max_tokens, and once sandcell gives up on it at the wall time, the server goes on with
    # it (it does not notice the client left) until its context is full, minutes later.
    with LlamaServer(tmp_path / "server.log") as own:
        done, out, took = run(own, tmp_path, protocol, TASK, WALL, "--max-steps", "1")
    steps = ended_well(done, out, took, WALL)
    tool_calls_executed_with_their_ids(steps)


def ended_well(
    done: subprocess.CompletedProcess, out: Path, took: float, wall: float, stepped: bool = True
) -> list:
    """The run ended within its wall time with a stop reason, exit 0 or 1 and no traceback;
    its trace is complete and its notebook re-runs. The steps, for more checks. `stepped`:
    a step ended before the wall time (not so where the first reply can outlast it)."""
    said = done.stdout + done.stderr
    assert done.returncode in (0, 1), said
    assert "Traceback" not in said
    events = read_trace(out / "trace.jsonl")
    assert [e["type"] for e in events][:2] == ["session", "question"]
    final = [e for e in events if e["type"] == "final"]
    assert len(final) == 1 and final[0]["stop_reason"] in ENDED, final
    assert final[0]["duration_s"] <= wall + 20  # a cell may run past the wall: 15 s at most
    assert took < wall + 60  # the whole command, its sandbox start and stop included
    steps = steps_of(events)
    assert steps or not stepped, final
    assert all(s["reply"]["retries"] == 0 for s in steps)  # nothing asked twice
    for step in steps:
        calls = {c["id"] for c in step["reply"]["tool_calls"]}
        assert {o["call_id"] for o in step.get("observations", []) if o["call_id"]} <= calls
    # the notebook holds the code that ran, and re-runs it to the same outputs
    nb = nbformat.read(str(out / "notebook.ipynb"), as_version=4)
    ran = [o for s in steps for o in s.get("observations", []) if o["tool"] == "python"]
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert len(code) == len([o for o in ran if o["execution"]])
    if code:
        replay = sandcell("replay", str(out / "trace.jsonl"), timeout=180)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert f"{len(code)} cells replayed, {len(code)} same" in replay.stdout
    return steps


def tool_calls_executed_with_their_ids(steps: list[dict]) -> None:
    """At least one tool call the server generated ran in the sandbox, and its observation
    carries that call's id: the first step asked for a tool (tool_choice "required", which
    this server refuses, so asked again without it) and the model called one."""
    assert steps[0]["tool_choice"] == "required"
    first = steps[0]["reply"]
    assert first["tool_calls"] and first["finish_reason"] == "tool_calls"
    call, observation = first["tool_calls"][0], steps[0]["observations"][0]
    assert call["id"].startswith("call_") and observation["call_id"] == call["id"]
    assert observation["tool"] == call["name"] == "python"
    assert observation["execution"] is not None  # it ran in the sandbox
    # an unstreamed tool-call reply carries the server's own token counts
    assert first["usage"]["estimated"] is False and first["usage"]["prompt_tokens"] > 100


@pytest.mark.docker
@pytest.mark.timeout(WALL + 200)
def test_chat_shows_the_tokens_as_the_server_streams_them(llama, tmp_path):
    folder = tmp_path / "session"
    child = sandcell_terminal(
        "chat", "--input", str(numbers(tmp_path)), "--output", str(folder),
        *endpoint(llama), "--protocol", "react", "--wall", str(WALL), "--max-steps", "2",
        "--timeout", "15",
        env={**env(), "TERM": "dumb", "COLUMNS": "120"},
        encoding="utf-8", timeout=WALL + 60, cwd=str(tmp_path),
    )  # fmt: skip
    child.logfile_read = (tmp_path / "transcript.txt").open("w")
    try:
        child.expect("you> ")
        child.sendline("Describe the file numbers.csv in two sentences.")
        arrivals: list[tuple[float, str]] = []  # what the terminal showed, and when
        seen = ""
        while "you> " not in seen[-200:]:
            piece = child.read_nonblocking(4096, timeout=WALL + 30)
            arrivals.append((time.monotonic(), piece))
            seen += piece
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, seen
    assert "Traceback" not in seen
    events = read_trace(folder / "trace.jsonl")
    replies = [s["reply"]["text"] for s in steps_of(events) if s["reply"]["text"].strip()]
    assert replies
    # the first reply reached the terminal in pieces, over time: its start well before its end
    reply = replies[0].strip()
    assert len(reply) >= 30, reply
    first, last = shown_at(arrivals, reply[:6]), shown_at(arrivals, reply[-6:])
    assert last[0] - first[0] >= 2 and last[1] - first[1] > 0.05, arrivals[:30]
    # streamed replies carry no usage from this server: estimated, and marked so
    assert all(s["reply"]["usage"]["estimated"] for s in steps_of(events))


def shown_at(arrivals: list[tuple[float, str]], text: str) -> tuple[int, float]:
    """The read (its number and time) by which the terminal had shown `text`."""
    seen = ""
    for i, (when, piece) in enumerate(arrivals):
        seen += piece
        if text in seen:
            return i, when
    raise AssertionError(f"{text!r} never shown")


@pytest.mark.docker
@pytest.mark.timeout(WALL + 200)
def test_a_runaway_reply_is_capped_or_stopped_and_nothing_is_asked_twice(llama, tmp_path):
    """`run --protocol react` with no --max-tokens and no SANDCELL_MAX_TOKENS, on a task that
    makes the model write without end: each reply is capped at sandcell's 4096 tokens, and
    the reply is cut there ("length": the loop nudges) or, still streaming at the wall time,
    dropped there; each model call is one request, and the server is free right after (it
    stops generating once the client has gone)."""
    task = "Write a very long story about a cat, at least 5000 words, before any final answer."
    before = llama.chat_requests()
    done, out, took = run(llama, tmp_path, "react", task, WALL, "--max-steps", "1")
    ended_well(done, out, took, WALL, stepped=False)
    events = read_trace(out / "trace.jsonl")
    assert events[0]["max_tokens"] == 4096  # the default, sent with every request
    final = [e for e in events if e["type"] == "final"][0]
    cut = [s for s in steps_of(events) if s["reply"]["finish_reason"] == "length"]
    assert cut or final["stop_reason"] == stops.WALL_TIME, final
    for step in cut:
        assert step["error"] == "cut by the length limit"  # nudged, not run
    # one request per model call: the steps the trace holds, and perhaps one more, a reply
    # dropped mid-stream at the wall time (it has no step record); never a retry besides
    steps = len(steps_of(events))
    assert steps <= llama.chat_requests() - before <= steps + 1
    quick = OpenAIModel(MODEL, base_url=llama.url, api_key="none", max_tokens=1, timeout_s=30)
    started = time.monotonic()
    quick.complete([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 20  # not queued behind the dropped reply


@pytest.mark.timeout(240)
def test_a_reply_streaming_for_longer_than_the_read_timeout_is_not_cut(llama):
    """A 12 s read timeout holds between chunks: a reply streaming for far longer arrives
    whole, from one request."""
    model = OpenAIModel(MODEL, base_url=llama.url, api_key="none", timeout_s=12.0, max_tokens=1200)
    prompt = [{"role": "user", "content": "Write a long story about a cat, at least 900 words."}]
    # First the same prompt for one token, given all the time it needs: it waits out a reply
    # an earlier test left generating (the server takes one at a time), and the server keeps
    # the prompt's evaluation, so the timed reply's first chunk is not a loaded machine's
    # prompt reading.
    OpenAIModel(MODEL, base_url=llama.url, api_key="none", max_tokens=1, timeout_s=120).complete(
        prompt, on_token=lambda _: None
    )
    before = llama.chat_requests()
    started = time.monotonic()
    tokens: list[str] = []
    reply = model.complete(prompt, on_token=tokens.append)
    took = time.monotonic() - started
    assert took > model.timeout_s, (took, reply.text[:200])
    assert reply.retries == 0 and llama.chat_requests() - before == 1
    assert len(tokens) > 50 and "".join(tokens) == reply.text
    assert reply.finish_reason == "length"  # the server honours the cap on a plain request


def test_the_servers_errors_are_said_not_retried(llama):
    """A request too long for the server's context: in a stream it only closes the connection;
    asked again unstreamed it says why, and that is the one error."""
    model = OpenAIModel(MODEL, base_url=llama.url, api_key="none", retry_base_s=0.01)
    before = llama.chat_requests()
    with pytest.raises(ModelError) as err:
        model.complete([{"role": "user", "content": "word " * 9000}])
    assert "exceed context window" in str(err.value) or "context length" in str(err.value)
    assert llama.chat_requests() - before == 2  # the stream, then once unstreamed
    assert json.dumps(str(err.value)).count("\\n") == 0


@pytest.mark.timeout(240)
def test_a_figure_is_refused_by_a_model_without_vision_and_told_apart(llama):
    """With a text-only chat format the server puts an image part into the prompt as text (the
    whole data URL): a chart-sized PNG overflows the context. That is taken for a refusal of
    the images (ImagesUnsupported, so `--vision auto` sends the request again without them)."""
    import base64
    import io
    import random

    from PIL import Image

    from sandcell.agent.seams import ImagesUnsupported

    noise = Image.frombytes("RGB", (200, 150), random.Random(0).randbytes(200 * 150 * 3))
    out = io.BytesIO()
    noise.save(out, "PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
    figure = [{"type": "text", "text": "The figure:"}, {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
    model = OpenAIModel(MODEL, base_url=llama.url, api_key="none", retry_base_s=0.01)
    with pytest.raises(ImagesUnsupported, match="--vision off"):
        model.complete([{"role": "user", "content": "Describe it."}, {"role": "user", "content": figure}])  # fmt: skip
    reply = model.complete([{"role": "user", "content": "Say hi."}])
    assert reply.finish_reason in ("stop", "length")


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_run_behind_an_abandoned_request_ends_at_its_wall(tmp_path):
    """Issue 27: an unstreamed request (as this server answers tool calls) abandoned by its
    client keeps the server generating; a `run --protocol tools --wall 20` behind it waits in the
    server's queue and still ends at its wall: wall_time in the trace within 3 s of it, exit 1,
    and one line saying the endpoint was still busy."""
    problem = missing()
    if problem:
        cannot_run(problem, "realmodel test")
    story = "Write a very long story about a cat, at least 5000 words, before anything else."
    with LlamaServer(tmp_path / "server.log") as own:  # its own: it stays busy for minutes
        # unstreamed, as a tool call to this server is; SmolLM2 answers a tool-call request
        # in a second, so this one is a story that may not end before its 4096 tokens (its
        # end-of-text refused until then: a logit bias on ids 0-2 did not hold it, and it ended
        # after 661 tokens, 8 s, sooner than a run's wall): 86 s here, unless the server is
        # stopped first (it is, below)
        busy = {
            "model": MODEL,
            "messages": [{"role": "user", "content": story}],
            "max_tokens": 4096,
            "min_tokens": 4096,  # llama-cpp-python's own field
        }
        own.abandon(busy)
        began = time.time()
        done, out, took = run(own, tmp_path, "tools", TASK, 20)
        still_busy = own.chat_requests()
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    events = read_trace(out / "trace.jsonl")
    final = [e for e in events if e["type"] == "final"]
    assert len(final) == 1 and final[0]["stop_reason"] == stops.WALL_TIME, final
    assert "still busy" in final[0]["detail"] and "Traceback" not in said
    assert final[0]["duration_s"] < 20 + 3  # the promise: the question ends at its wall
    # The command's exit waits for the sandbox begun beside the question to start and be
    # removed (nothing may outlive it): 2 s here when quiet, 50 s in the parallel suite beside
    # this generating server and one more CPU hog. Its interpreter's start is left out too.
    ready = dt.datetime.fromisoformat(events[0]["time"]).timestamp() - began
    assert took - ready < 20 + 60, (took, ready, said)
    assert (out / "notebook.ipynb").exists() and (out / "answer.md").exists()
    assert still_busy >= 2  # the abandoned request and the run's own
    print(
        f"run behind a busy server, --wall 20: question {final[0]['duration_s']:.1f} s, command {took:.1f} s ({ready:.1f} s to start)"
    )
