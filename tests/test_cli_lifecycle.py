"""Nothing is lost: Ctrl-C and SIGTERM in `run`, `exec`, `chat` and `batch` keep what was done
and remove every container; `run` and `exec --output` bring back every file the code made.
The real CLI in a subprocess, real sandboxes, scripted replies."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandcell.agent.records.trace import read_trace
from tests.cli_runner import sandcell, sandcell_process, sandcell_terminal
from tests.containers import container_labels, owner_label
from tests.otlp_receiver import receiving
from tests.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

SALES = Path(__file__).parent / "data" / "agent" / "sales.csv"
SLOW = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)"


def python(code: str) -> dict:
    return {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}


def write_script(path: Path, replies: list) -> Path:
    path.write_text(json.dumps(replies))
    return path


def steps_in(trace: Path) -> int:
    return trace.read_text().count('"type": "step"') if trace.exists() else 0


def stop_midway(proc: subprocess.Popen, sig: int) -> tuple[str, str]:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=90)
    return out, err


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_run_stopped_midway_keeps_trace_notebook_answer_and_files(tmp_path, sig, status):
    first = (
        "import os\nos.makedirs('/workspace/output', exist_ok=True)\n"
        "open('/workspace/output/half.csv', 'w').write('a\\n1\\n')\nprint('first done')"
    )
    script = write_script(tmp_path / "s.json", [python(first), python(SLOW), "Final Answer: x"])
    out = tmp_path / "out"
    args = ["run", "--task", "x", "--input", str(SALES), "--output", str(out), "--replay", str(script)]  # fmt: skip
    # started as a script's `cmd &` (or a CI job) starts it: SIGINT ignored, inherited. Ctrl-C
    # must still stop it: before the fix the signal was lost and the cell ran to its timeout
    proc = sandcell_process(*args, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        wait_for(lambda: steps_in(out / "trace.jsonl") >= 1, 120)
        time.sleep(1.5)  # the second cell is sleeping now
        _, err = stop_midway(proc, sig)
    finally:
        proc.kill()
    assert proc.returncode == status, err
    assert "Traceback" not in err and "what was done is kept" in err
    final = [e for e in read_trace(out / "trace.jsonl") if e["type"] == "final"]
    assert final[-1]["stop_reason"] == ("interrupted" if sig == signal.SIGINT else "terminated")
    answer = (out / "answer.md").read_text()
    assert answer.startswith("No answer: the run was") and "kept" in answer
    notebook = json.loads((out / "notebook.ipynb").read_text())
    sources = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert sources[0] == first
    assert (out / "output" / "half.csv").read_text() == "a\n1\n"
    assert container_labels(owner_label(proc.pid)) == []


def test_exec_sigterm_removes_the_container_and_exits_143(tmp_path):
    proc = sandcell_process("exec", "-c", SLOW)
    try:
        wait_for(lambda: container_labels(owner_label(proc.pid), running_only=True) != [], 120)
        time.sleep(2)
        _, err = stop_midway(proc, signal.SIGTERM)
    finally:
        proc.kill()
    assert proc.returncode == 143 and "terminated (SIGTERM)" in err and "Traceback" not in err
    assert container_labels(owner_label(proc.pid)) == []


def test_chat_sigterm_mid_cell_ends_cleanly(tmp_path):
    script = write_script(tmp_path / "s.json", [python(SLOW), "Final Answer: x"])
    folder = tmp_path / "chat"
    proc = sandcell_process(
        "chat", "--replay", str(script), "--output", str(folder), stdin=subprocess.PIPE
    )
    try:
        proc.stdin.write("sleep please\n")
        proc.stdin.flush()
        wait_for(lambda: container_labels(owner_label(proc.pid), running_only=True) != [], 120)
        time.sleep(3)  # the scripted model answers at once: the cell is sleeping now
        out, err = stop_midway(proc, signal.SIGTERM)
    finally:
        proc.kill()
    assert proc.returncode == 143, out + err
    assert "Traceback" not in out + err and "session saved in" in out
    assert container_labels(owner_label(proc.pid)) == []
    kinds = [e["type"] for e in read_trace(folder / "trace.jsonl")]
    assert kinds[-1] == "final"  # the question ended before the session did: the trace is whole


def test_exec_output_keeps_figures_and_files_and_prints_host_paths(tmp_path):
    code = (
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"
        "import os\nos.makedirs('/workspace/sub', exist_ok=True)\n"
        "open('/workspace/sub/made.txt', 'w').write('made')"
    )
    out = tmp_path / "kept"
    done = sandcell("exec", "--output", str(out), "-c", code)
    assert done.returncode == 0, done.stderr
    assert (out / "figures" / "figure-1.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "sub" / "made.txt").read_text() == "made"
    assert f"saved {out / 'figures' / 'figure-1.png'}" in done.stderr
    without = sandcell("exec", "-c", code)
    assert "pass --output DIR to keep its files" in without.stderr


def test_run_brings_back_charts_and_every_file_the_code_made(tmp_path):
    code = (
        "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()\n"
        "import os\nos.makedirs('/workspace/cleaned', exist_ok=True)\n"
        "open('/workspace/cleaned/sales.csv', 'w').write('x\\n1\\n')\n"
        "os.makedirs('/workspace/output', exist_ok=True)\n"
        "open('/workspace/output/summary.txt', 'w').write('ok')"
    )
    script = write_script(tmp_path / "s.json", [python(code), "Final Answer: saved"])
    out = tmp_path / "out"
    args = ["run", "--task", "x", "--output", str(out), "--replay", str(script)]
    done = sandcell(*args)
    assert done.returncode == 0, done.stderr
    assert (out / "output" / "summary.txt").read_text() == "ok"
    assert (out / "figures" / "figure-1.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "workspace" / "cleaned" / "sales.csv").read_text() == "x\n1\n"
    for path in ("output/summary.txt", "figures/figure-1.png", "workspace/cleaned/sales.csv"):
        assert f"wrote {out / path}" in done.stderr
    # the same folder again is refused; --overwrite replaces sandcell's files there
    again = sandcell(*args)
    assert (
        again.returncode == 2 and "is not empty" in again.stderr and "--overwrite" in again.stderr
    )
    (out / "mine.txt").write_text("the user's own file")
    script.write_text(json.dumps(["Final Answer: nothing this time"]))
    over = sandcell(*args, "--overwrite")
    assert over.returncode == 0, over.stderr
    assert not (out / "output").exists() and not (out / "figures").exists()
    assert (out / "mine.txt").read_text() == "the user's own file"
    assert (out / "answer.md").read_text() == "nothing this time\n"


def make_jobs(tmp_path: Path, count: int, first_code: str) -> Path:
    lines = []
    for i in range(count):
        script = write_script(
            tmp_path / f"job-{i}.json", [python(first_code), f"Final Answer: {i}"]
        )
        lines.append(json.dumps({"id": f"j{i}", "task": "t", "inputs": [str(SALES)], "replay": script.name}))  # fmt: skip
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(lines) + "\n")
    return jobs


@pytest.mark.timeout(400)
@pytest.mark.xdist_group("batch-term")
def test_batch_sigterm_stops_running_jobs_and_a_rerun_redoes_only_them(tmp_path):
    """With traces on: the stopped jobs' spans are exported as the batch ends."""
    jobs = make_jobs(tmp_path, 4, SLOW)
    out = tmp_path / "out"
    args = ["batch", str(jobs), "--output", str(out), "--workers", "2", "--no-progress"]
    with receiving() as receiver:
        traced = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        proc = sandcell_process(*args, env=traced)
        try:
            wait_for(lambda: sum(steps_in(out / f"j{i}" / "trace.jsonl") == 0 and (out / f"j{i}" / "trace.jsonl").exists() for i in range(4)) >= 2, 120)  # fmt: skip
            wait_for(lambda: len(container_labels(owner_label(proc.pid), running_only=True)) >= 2, 120)  # fmt: skip
            time.sleep(3)  # two jobs are inside their sleeping cells
            _, err = stop_midway(proc, signal.SIGTERM)
        finally:
            proc.kill()
        wait_for(lambda: len(receiver.named("sandcell batch job")) == 2, 20, "the job spans")
        stopped = receiver.named("sandcell batch job")
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    assert container_labels(owner_label(proc.pid)) == []
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {r["status"] for r in records} == {"interrupted"}
    assert sorted(s["attributes"]["sandcell.job.id"] for s in stopped) == sorted(
        r["id"] for r in records
    )
    assert {s["attributes"]["sandcell.job.status"] for s in stopped} == {"interrupted"}
    # the rerun: the two interrupted jobs and the two never started, with quick scripts now
    for i in range(4):
        write_script(tmp_path / f"job-{i}.json", [python("print(1)"), f"Final Answer: {i}"])
    done = sandcell(*args, timeout=300)
    assert done.returncode == 0, done.stderr
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["id"], r["status"]) for r in records) == [
        (f"j{i}", "answered") for i in range(4)
    ]
    third = sandcell(*args)
    assert "skipped 4 finished jobs" in third.stdout and third.returncode == 0


def test_batch_prints_each_stopped_job_s_reason(tmp_path):
    same = python("print(1)")
    write_script(tmp_path / "loops.json", [same, same, same, same])
    (tmp_path / "jobs.jsonl").write_text(json.dumps({"id": "loops", "task": "t", "replay": "loops.json"}) + "\n")  # fmt: skip
    out = tmp_path / "out"
    args = ["batch", str(tmp_path / "jobs.jsonl"), "--output", str(out), "--no-progress"]
    done = sandcell(*args, timeout=200)
    assert done.returncode == 1
    assert "loops: stopped: repeated_action (the same action was sent" in done.stderr
    again = sandcell(*args, timeout=200)
    assert "skipped 1 finished jobs" in again.stdout  # a stop of the job itself is final


# -- no silent wait: output shows as the code prints it -------------------------------------------

TICKS = "import time\nfor i in range(6):\n    print('tick', i, flush=True)\n    time.sleep(0.5)"


def test_exec_streams_stdout_while_the_cell_runs():
    proc = sandcell_process("exec", "-c", TICKS)
    try:
        first = proc.stdout.readline()
        running_at_first_line = proc.poll() is None
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert first == "tick 0\n" and running_at_first_line  # shown before the cell ended
    assert rest == "".join(f"tick {i}\n" for i in range(1, 6))  # each line once
    assert proc.returncode == 0


def test_run_on_a_terminal_shows_steps_and_output_as_they_happen(tmp_path):
    import pexpect

    script = write_script(tmp_path / "s.json", [python(TICKS), "Final Answer: ticked"])
    args = ["run", "--task", "tick", "--replay", str(script)]
    terminal = dict(encoding="utf-8", timeout=120, env={**os.environ, "TERM": "dumb", "COLUMNS": "120"})  # fmt: skip
    child = sandcell_terminal(*args, "--output", str(tmp_path / "o"), **terminal)
    try:
        child.expect("python")  # the code panel, before the cell runs
        child.expect("tick 0")
        assert child.isalive()  # the cell is still running
        child.expect("tick 5")
        child.expect("ticked")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    quiet = sandcell_terminal(*args, "--output", str(tmp_path / "q"), "--quiet", **terminal)
    try:
        quiet.expect(pexpect.EOF)
    finally:
        quiet.close(force=True)
    assert quiet.exitstatus == 0 and "tick 0" not in quiet.before and "ticked" in quiet.before
