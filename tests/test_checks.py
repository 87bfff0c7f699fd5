"""Declared checks on a job's outputs (issue 24): the real CLI, a real sandbox, a scripted model.
The checks run in a fresh `python -I` process in the sandbox; a failure goes back to the model."""

import hashlib
import json

import pandera.pandas as pa
import pytest

from sandcell.agent import stops
from sandcell.agent.events import ChecksRun, Event
from sandcell.agent.records.trace import read_trace
from tests.cli_runner import sandcell
from tests.scripted_server import ScriptedServer

MESSY = "id,amount,region\n1,10.5,N\n2,-3,S\n2,-3,S\n3,,N\n4,7,X\n"
BAD = (
    "import pandas as pd, os\nos.makedirs('/workspace/output', exist_ok=True)\n"
    "pd.read_csv('/data/messy.csv').to_csv('/workspace/output/clean.csv', index=False)\n"
)
GOOD = (
    "import pandas as pd\ndf = pd.read_csv('/data/messy.csv').drop_duplicates()\n"
    "df = df[(df.amount >= 0) & df.region.isin(['N', 'S'])]\n"
    "df.to_csv('/workspace/output/clean.csv', index=False)\nprint(len(df))\n"
)


def schema() -> pa.DataFrameSchema:
    return pa.DataFrameSchema(
        {
            "id": pa.Column(int, unique=True),
            "amount": pa.Column(float, pa.Check.ge(0)),
            "region": pa.Column(str, pa.Check.isin(["N", "S"])),
        },
        strict=True,
        coerce=True,
    )


@pytest.fixture
def files(tmp_path):
    (tmp_path / "messy.csv").write_text(MESSY)
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "sales.yaml").write_text(schema().to_yaml())
    return tmp_path


def python(code: str) -> dict:
    return {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}


def model_args(server: ScriptedServer) -> list[str]:
    return ["--base-url", server.url, "--api-key", "k", "--model", "m", "--protocol", "tools"]


def checks_events(folder) -> list[ChecksRun]:
    events = [Event.from_json(r) for r in read_trace(folder / "trace.jsonl")]
    return [e for e in events if isinstance(e, ChecksRun)]


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_failed_check_goes_back_to_the_model_and_the_second_answer_passes(files):
    seen = {}

    def fix(body: dict) -> dict:
        seen["feedback"] = body["messages"][-1]["content"]
        return python(GOOD)

    script = [python(BAD), "Final Answer: cleaned.", fix, "Final Answer: cleaned, 2 rows kept."]
    out = files / "out"
    with ScriptedServer(script) as server:
        proc = sandcell(
            "run", "--task", "Clean messy.csv into output/clean.csv",
            "--input", str(files / "messy.csv"), "--output", str(out),
            "--expect", "output/clean.csv=schemas/sales.yaml", *model_args(server),
            timeout=280, cwd=files,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the expectations are in the first request, beside the input profile
    system = server.requests[0]["messages"][0]["content"]
    assert "/data/messy.csv" in system and "Expected outputs" in system
    assert "/workspace/output/clean.csv (schema sales.yaml)" in system
    assert "- amount: float64, no nulls, greater_than_or_equal_to(0)" in system
    # the failure reached the model, bounded to column, check, count and examples
    feedback = seen["feedback"]
    assert (
        feedback.startswith("Your Final Answer was not accepted") and "attempt 1 of 3" in feedback
    )
    assert "column amount, check greater_than_or_equal_to(0): 2 failure(s)" in feedback
    assert "column id, check field_uniqueness" in feedback
    assert "column region, check isin(['N', 'S']): 1 failure(s), e.g. row 4: 'X'" in feedback
    first, second = checks_events(out)
    assert (first.attempt, first.passed, second.attempt, second.passed) == (1, False, 2, True)
    copied = out / "output" / "clean.csv"
    digest = hashlib.sha256(copied.read_bytes()).hexdigest()
    assert second.outputs["output/clean.csv"] == {"passed": True, "sha256": digest, "failures": []}
    assert second.cpu_s > 0 and second.duration_s > 0
    answer = (out / "answer.md").read_text()
    assert "## Checks" in answer and "All declared checks passed." in answer
    assert f"sha256 `{digest[:16]}`" in answer


@pytest.mark.docker
@pytest.mark.timeout(400)
def test_a_job_that_never_passes_fails_and_a_rerun_retries_it(files):
    never = [python(BAD), "Final Answer: done.", "Final Answer: done, really."]
    (files / "never.json").write_text(json.dumps(never))
    job = {"id": "sales", "task": "Clean messy.csv", "inputs": ["messy.csv"],
           "replay": "never.json", "expect": {"output/clean.csv": "schemas/sales.yaml"}}  # fmt: skip
    plain = {"id": "plain", "task": "Nothing to check", "replay": "plain.json"}
    (files / "plain.json").write_text(json.dumps(["Final Answer: nothing."]))
    jobs = files / "jobs.jsonl"
    jobs.write_text(json.dumps(job) + "\n" + json.dumps(plain) + "\n")
    out = files / "out"
    args = ["batch", str(jobs), "--output", str(out), "--no-progress", "--check-retries", "2"]
    first = sandcell(*args, timeout=380)
    assert first.returncode == 1, first.stderr
    assert "1 answered, 0 stopped without an answer, 1 failed" in first.stdout
    assert "sales: failed: the outputs failed their checks on 2 final answer(s)" in first.stderr
    assert "rerun the same command to retry the 1 unfinished jobs" in first.stderr
    records = {json.loads(x)["id"]: json.loads(x) for x in (out / "results.jsonl").open()}
    failed = records["sales"]
    assert (failed["status"], failed["stop_reason"]) == ("failed", stops.CHECKS_FAILED)
    verdict = failed["checks"]["outputs"]["output/clean.csv"]
    assert failed["checks"]["passed"] is False and verdict["passed"] is False
    assert len(verdict["sha256"]) == 64
    assert {f["check"] for f in verdict["failures"]} >= {
        "greater_than_or_equal_to(0)",
        "field_uniqueness",
    }
    assert "checks" not in records["plain"]  # a job with nothing declared says nothing
    assert "The declared checks FAILED." in (out / "sales" / "answer.md").read_text()
    assert [e.passed for e in checks_events(out / "sales")] == [False, False]

    (files / "never.json").write_text(json.dumps([python(BAD + GOOD), "Final Answer: fixed."]))
    second = sandcell(*args, timeout=380)
    assert second.returncode == 0, second.stderr
    assert "skipped 1 finished jobs" in second.stdout
    lines = [json.loads(x) for x in (out / "results.jsonl").open()]
    assert [r["id"] for r in lines] == ["sales", "plain"]
    assert lines[0]["status"] == "answered" and lines[0]["checks"]["passed"] is True


def test_a_schema_pandera_cannot_load_is_a_usage_error_before_anything_starts(files):
    bad = files / "schemas" / "bad.yaml"
    bad.write_text("schema_type: dataframe\ncolumns:\n  id:\n    dtype: no_such_dtype\n")
    out = files / "out"
    (files / "script.json").write_text(json.dumps(["Final Answer: x."]))
    proc = sandcell(
        "run", "--task", "t", "--output", str(out), "--replay", str(files / "script.json"),
        "--expect", f"output/clean.csv={bad}", timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert f"{bad}: pandera cannot load this schema" in proc.stderr
    assert not out.exists()

    (files / "schemas" / "notes.yaml").write_text("just: some yaml\n")
    job = {"id": "a", "task": "t", "expect": {"output/clean.csv": "schemas/notes.yaml"}}
    jobs = files / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": "ok", "task": "t"}) + "\n" + json.dumps(job) + "\n")
    proc = sandcell("batch", str(jobs), "--output", str(out), timeout=60)
    assert proc.returncode == 2
    assert f"{jobs}:2: {files / 'schemas' / 'notes.yaml'}: pandera cannot load" in proc.stderr
    assert 'no "schema_type: dataframe"' in proc.stderr and not out.exists()

    proc = sandcell("batch", str(jobs), "--output", str(out), "--expect", "clean.csv", timeout=60)
    assert proc.returncode == 2 and "write OUT=SCHEMA" in proc.stderr and not out.exists()


# Model code that patches pandas and pandera in its kernel, and leaves modules where a
# checker that imported from the workspace or the user's site would pick them up.
PATCH = """
import json, os, pandas as pd, pandera, pandera.pandas as pa
pa.DataFrameSchema.validate = lambda self, df, *a, **k: df
pandera.api.pandas.container.DataFrameSchema.validate = lambda self, df, *a, **k: df
pd.read_csv = lambda *a, **k: pd.DataFrame({"id": [1], "amount": [1.0], "region": ["N"]})
forge = '''import json
_dump = json.dump
def dump(obj, fp, *a, **k):
    for v in obj.get("outputs", {}).values():
        v.update(passed=True, failures=[])
    return _dump(obj, fp, *a, **k)
json.dump = dump
'''
site = os.path.expanduser('~/.local/lib/python3.11/site-packages')
for folder in ('/workspace', '/workspace/output', site, '/tmp'):
    os.makedirs(folder, exist_ok=True)
    for name in ('sitecustomize.py', 'usercustomize.py'):
        open(os.path.join(folder, name), 'w').write(forge)
os.makedirs('/workspace/pandera', exist_ok=True)
open('/workspace/pandera/__init__.py', 'w').write(forge)
"""


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_model_code_that_patches_pandera_in_its_kernel_cannot_make_a_check_pass(files):
    script = [python(BAD + PATCH), "Final Answer: clean.", "Final Answer: it is clean."]
    out = files / "out"
    with ScriptedServer(script) as server:
        proc = sandcell(
            "run", "--task", "Clean messy.csv", "--input", str(files / "messy.csv"),
            "--output", str(out), "--expect", "output/clean.csv=schemas/sales.yaml",
            "--check-retries", "2", *model_args(server), timeout=280, cwd=files,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "stopped without an answer: checks_failed" in proc.stderr
    runs = checks_events(out)
    assert [r.passed for r in runs] == [False, False]
    failures = runs[-1].outputs["output/clean.csv"]["failures"]
    assert {f["check"] for f in failures} >= {"greater_than_or_equal_to(0)", "isin(['N', 'S'])"}
    assert "The declared checks FAILED." in (out / "answer.md").read_text()


# -- the host's side, no sandbox -------------------------------------------------------------


def test_a_copied_file_that_is_not_the_bytes_checked_fails_its_check(tmp_path):
    from sandcell.agent.output_checks import verify_copied

    (tmp_path / "clean.csv").write_text("id\n1\n")
    good = hashlib.sha256(b"id\n1\n").hexdigest()
    checks = {"passed": True, "outputs": {
        "output/clean.csv": {"passed": True, "sha256": good, "failures": []},
        "output/changed.csv": {"passed": True, "sha256": good, "failures": []},
        "output/gone.csv": {"passed": True, "sha256": good, "failures": []},
    }}  # fmt: skip
    (tmp_path / "changed.csv").write_text("id\n2\n")
    problems = verify_copied(checks, lambda p: tmp_path / p.split("/")[-1])
    assert problems == [
        "/workspace/output/changed.csv changed after its check",
        "/workspace/output/gone.csv was not copied back",
    ]
    assert checks["passed"] is False and checks["outputs"]["output/clean.csv"]["passed"] is True
    assert checks["outputs"]["output/gone.csv"]["failures"][0]["check"] == "copied"


def test_output_paths_stay_under_the_workspace_and_the_schema_is_shown_compactly(files):
    from sandcell.agent.output_checks import ExpectError, describe, load_expect, output_path

    assert output_path("/workspace/output/a.csv") == output_path("output/a.csv") == "output/a.csv"
    for bad in ("/etc/passwd", "../a.csv", "output/../../a.csv", "."):
        with pytest.raises(ExpectError, match="output"):
            output_path(bad)
    expect = load_expect({"output/clean.csv": "schemas/sales.yaml"}, files)
    assert describe(expect).splitlines()[1:] == [
        "/workspace/output/clean.csv (schema sales.yaml):",
        "table: strict, coerce",
        "- id: int64, no nulls, unique",
        "- amount: float64, no nulls, greater_than_or_equal_to(0)",
        f"- region: {schema().columns['region'].dtype}, no nulls, isin(['N', 'S'])",
    ]


def test_a_check_run_reads_back_from_the_trace_as_its_event():
    event = ChecksRun(question=1, attempt=2, passed=False, outputs={"o.csv": {"passed": False}},
                      duration_s=1.5, cpu_s=0.7)  # fmt: skip
    assert Event.from_json(json.loads(json.dumps(event.to_json()))) == event
