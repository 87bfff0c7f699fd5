"""`sandcell run` and `sandcell batch` end to end: real sandboxes, scripted replies, real CSVs."""

import hashlib
import json
import os
import subprocess

import pandas as pd
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from sandcell.agent import ScriptedModel, stops
from sandcell.agent.cli import main
from sandcell.agent.jobs.batch import Batch, Job, JobSettings, ThreadExecutor, load_jobs
from sandcell.agent.records.trace import read_trace
from sandcell.sandbox import Limits
from tests.cli_runner import sandcell, sandcell_process
from tests.containers import container_labels, owner_label
from tests.polling import kill_after_results
from tests.realdata import CSVS


def sha(path) -> tuple[str, int]:
    """Content and mode: neither may change (a hard link shares the user's inode)."""
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode


def job_script(csv_name: str) -> list:
    """Two steps: count the rows of one CSV, write it to output/, answer with the number."""
    code = (
        f"import pandas as pd, os\ndf = pd.read_csv('/data/{csv_name}')\n"
        "os.makedirs('/workspace/output', exist_ok=True)\n"
        "open('/workspace/output/rows.txt', 'w').write(str(len(df)))\nprint(len(df))"
    )
    return [
        {
            "content": "Thought: count the rows.",
            "tool_calls": [{"name": "python", "arguments": {"code": code}}],
        },
        {"content": f"Final Answer: {csv_name} has ROWS rows."},
    ]


def make_jobs(tmp_path, count: int, looping: set[int] = frozenset()) -> tuple:
    jobs, expected = [], {}
    for i in range(count):
        csv = CSVS[i % len(CSVS)]
        script = job_script(csv.name)
        if i in looping:  # a cell that never ends; the sandbox's timeout must stop it
            script[0]["tool_calls"][0]["arguments"]["code"] = "while True:\n    pass"
            script[1]["content"] = "Final Answer: the computation did not finish."
        rows = len(pd.read_csv(csv))
        script[1]["content"] = script[1]["content"].replace("ROWS", str(rows))
        (tmp_path / f"script-{i}.json").write_text(json.dumps(script))
        jobs.append(
            {
                "id": f"job-{i:02d}",
                "task": f"How many rows does {csv.name} have?",
                "inputs": [str(csv)],
                "replay": f"script-{i}.json",
            }
        )
        expected[f"job-{i:02d}"] = None if i in looping else rows
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("\n".join(json.dumps(j) for j in jobs) + "\n")
    return jobs_file, expected


def owned_by(pid: int) -> list[dict]:
    return container_labels(owner_label(pid))


@pytest.mark.docker
@pytest.mark.timeout(600)
@pytest.mark.xdist_group("batch")
def test_batch_of_20_jobs_with_4_workers_and_a_looping_one(tmp_path):
    before = {p: sha(p) for p in CSVS}
    jobs_file, expected = make_jobs(tmp_path, 20, looping={7})
    out = tmp_path / "out"
    args = ["batch", str(jobs_file), "--output", str(out), "--workers", "4", "--timeout", "20"]
    proc = sandcell_process(*args, "--no-progress")
    _, stderr = proc.communicate(timeout=580)
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(expected), stderr
    for record in records:
        rows = expected[record["id"]]
        if rows is None:
            assert record["status"] == "answered" and "did not finish" in record["answer"]
            continue
        assert record["status"] == "answered", record
        assert record["answer"].endswith(f"has {rows} rows.")
        assert (out / record["id"] / "output" / "rows.txt").read_text() == str(rows)
        assert (out / record["id"] / "answer.md").exists()
        assert (out / record["id"] / "notebook.ipynb").exists()
    looping = read_trace(out / "job-07" / "trace.jsonl")
    (ran,) = [o["execution"] for e in looping for o in e.get("observations") or []]
    # stopped at its deadline: interrupted, or (a loaded machine, the interrupt not taken
    # within its grace) the kernel restarted
    assert ran["timed_out"] and (ran["interrupted"] or ran["restarted"] == "timeout"), ran
    assert {p: sha(p) for p in CSVS} == before  # inputs byte-identical
    assert owned_by(proc.pid) == []  # no container left behind
    # the run's metrics, in the textfile collector's format: 20 cells, one timed out
    metrics = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families((out / "metrics.prom").read_text())
        for s in family.samples
    }
    cells = "sandcell_cell_duration_seconds_count"
    assert metrics[(cells, (("outcome", "timeout"),))] == 1
    assert metrics[(cells, (("outcome", "ok"),))] == 19
    assert metrics[("sandcell_model_request_duration_seconds_count", (("outcome", "ok"),))] == 40


@pytest.mark.docker
@pytest.mark.timeout(600)
@pytest.mark.xdist_group("batch-kill")
def test_batch_killed_midway_resumes_without_redoing_finished_jobs(tmp_path):
    jobs_file, expected = make_jobs(tmp_path, 8)
    out = tmp_path / "out"
    args = ["batch", str(jobs_file), "--output", str(out), "--workers", "2", "--no-progress"]
    first = sandcell_process(*args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = out / "results.jsonl"
    done_before = kill_after_results(first, results, 3, 240)
    assert 3 <= len(done_before) < 8
    second = sandcell_process(*args, stderr=subprocess.STDOUT)
    output, _ = second.communicate(timeout=400)
    assert second.returncode == 0, output
    lines = results.read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert sorted(ids) == sorted(expected)  # every job once: none redone, none lost
    for line in lines:
        record = json.loads(line)
        if record["id"] in done_before:
            assert line == done_before[record["id"]]
    assert owned_by(first.pid) == [] and owned_by(second.pid) == []  # the orphans were reaped


@pytest.mark.docker
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("run")
def test_run_writes_answer_trace_notebook_and_outputs(tmp_path):
    jobs_file, expected = make_jobs(tmp_path, 1)
    out = tmp_path / "run"
    csv = CSVS[0]
    args = ["run", "--task", "count rows", "--input", str(csv), "--output", str(out)]
    proc = sandcell(*args, "--replay", str(tmp_path / "script-0.json"), timeout=280)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"has {expected['job-00']} rows.")
    assert (out / "output" / "rows.txt").read_text() == str(expected["job-00"])
    kinds = [json.loads(x)["type"] for x in (out / "trace.jsonl").read_text().splitlines()]
    assert kinds[:2] == ["session", "question"] and kinds[-1] == "final" and "step" in kinds
    assert (out / "notebook.ipynb").exists() and (out / "answer.md").exists()
    audit = json.loads((out / "audit.json").read_text())  # the input read on the host
    assert [(t["path"], t["rows"]) for t in audit["inputs"]] == [(csv.name, expected["job-00"])]
    assert audit["outputs"] == [] and "## Audit" in (out / "answer.md").read_text()


def test_bad_jobs_file_is_a_usage_error_naming_the_line(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "task": "x"}\nnot json\n')
    result = CliRunner().invoke(main, ["batch", str(jobs), "--output", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert f"Error: {jobs}:2: not JSON (Expecting value); each line is one job object" in (
        result.stderr
    )


@pytest.mark.docker
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("run")
def test_a_failed_job_is_retried_on_rerun_and_results_keep_one_line_per_job(tmp_path):
    jobs_file, expected = make_jobs(tmp_path, 2)
    jobs = [json.loads(line) for line in jobs_file.read_text().splitlines()]
    del jobs[1]["replay"]  # no script and no endpoint: this job fails with a model error
    jobs_file.write_text("\n".join(json.dumps(j) for j in jobs) + "\n")
    out = tmp_path / "out"
    args = ["batch", str(jobs_file), "--output", str(out), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    first = sandcell(*args, timeout=280, env=env)
    assert first.returncode == 1 and "job-01: failed: ModelError" in first.stderr
    statuses = {
        json.loads(x)["id"]: json.loads(x)["status"]
        for x in (out / "results.jsonl").read_text().splitlines()
    }
    assert statuses == {"job-00": "answered", "job-01": "failed"}
    jobs[1]["replay"] = "script-1.json"  # the endpoint is back
    jobs_file.write_text("\n".join(json.dumps(j) for j in jobs) + "\n")
    second = sandcell(*args, timeout=280, env=env)
    assert second.returncode == 0, second.stderr
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["status"] for x in lines] == ["answered", "answered"]
    assert json.loads(lines[1])["answer"].endswith(f"has {expected['job-01']} rows.")


class ListedExecutor:
    """An executor of its own (agent.jobs.batch.Executor): answers each job at once, but stops
    `failing` ones with a model error (a rerun retries those); notes what it was given."""

    def __init__(self, failing: set[str] = frozenset()):
        self.failing, self.given, self.entered, self.left = failing, [], 0, 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        self.left += 1

    def run(self, jobs, batch):
        self.given.append([job.id for job in jobs])
        records = []
        for job in jobs:
            batch.started()
            (batch.output / job.id).mkdir(exist_ok=True)
            if job.id in self.failing:
                record = {"id": job.id, "status": "stopped", "stop_reason": stops.MODEL_ERROR}
            else:
                record = {"id": job.id, "status": "answered", "answer": f"{job.task}!"}
            batch.record(record)
            records.append(record)
        return records


def test_a_batch_runs_on_any_executor_and_a_rerun_gives_it_only_the_unfinished_jobs(tmp_path):
    jobs = [Job(f"j{i}", f"task {i}") for i in range(3)]
    out = tmp_path / "out"
    first = ListedExecutor(failing={"j1"})
    records = Batch(jobs, out, first, progress=False).run()
    assert first.given == [["j0", "j1", "j2"]] and first.entered == first.left == 1
    assert [r["status"] for r in records] == ["answered", "stopped", "answered"]
    assert [json.loads(x)["id"] for x in (out / "results.jsonl").read_text().splitlines()] == [
        "j0",
        "j1",
        "j2",
    ]
    second = ListedExecutor()
    rerun = Batch(jobs, out, second, progress=False)
    records = rerun.run()
    assert second.given == [["j1"]] and rerun.skipped == 2
    assert [r["status"] for r in records] == ["answered"] * 3
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in lines] == [(f"j{i}", "answered") for i in range(3)]
    third = ListedExecutor()
    assert len(Batch(jobs, out, third, progress=False).run()) == 3
    assert third.given == [] and third.entered == third.left == 1  # nothing left to run


class NoCluster(ListedExecutor):
    def __enter__(self):
        raise ConnectionError("no cluster here")


def test_an_executor_that_cannot_start_fails_before_the_batch_writes_anything(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConnectionError):
        Batch([Job("a", "x")], out, NoCluster(), progress=False).run()
    assert not out.exists()


@pytest.mark.docker
@pytest.mark.timeout(300)
@pytest.mark.xdist_group("run")
def test_a_batch_over_threads_runs_each_job_in_its_sandbox_with_the_settings_given(tmp_path):
    jobs_file, expected = make_jobs(tmp_path, 2, looping={1})
    out = tmp_path / "out"
    settings = JobSettings(Limits(timeout_s=15))  # under load, pandas' import takes seconds
    executor = ThreadExecutor(2, settings, lambda job: ScriptedModel(job.replay))
    records = Batch(load_jobs(jobs_file), out, executor, progress=False).run()
    by_id = {r["id"]: r for r in records}
    assert by_id["job-00"]["status"] == "answered", by_id["job-00"]
    assert by_id["job-00"]["answer"].endswith(f"has {expected['job-00']} rows.")
    assert (out / "job-00" / "output" / "rows.txt").read_text() == str(expected["job-00"])
    looping = read_trace(out / "job-01" / "trace.jsonl")
    (ran,) = [o["execution"] for e in looping for o in e.get("observations") or []]
    # stopped by the 15 s of the settings' limits, not the default 60 s
    assert ran["timed_out"] and by_id["job-01"]["duration_s"] < 55, (ran, by_id["job-01"])
