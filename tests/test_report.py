"""The job audit (audit.json, answer.md's Audit section) and the batch report (report.html,
report.md, `sandcell report DIR`): a real batch in real sandboxes, the model scripted."""

import json
import time
from html.parser import HTMLParser

import pandas as pd
import pytest
from click.testing import CliRunner

from sandcell.agent.cli import main
from sandcell.tools import tables
from sandcell.tools.file_metadata import profile_file
from sandcell.tools.profile import Caps
from tests.cli_runner import sandcell, sandcell_process
from tests.polling import lines_in, wait_for

# 6 rows, 2 of them repeats (one with its blank amount written NA): 4 distinct rows; a bad
# amount ("abc") makes the column text; `notes` has 2 blanks
MESSY = """id,name,amount,region,notes
1,Ann,10.5,north,x
2,Bob,,south,
1,Ann,10.5,north,x
3,Cy,abc,east,y
2,Bob,NA,south,
4,Di,7,west,z
"""
CLEAN = """import pandas as pd, os
df = pd.read_csv('/data/sales.csv').drop_duplicates()
df['amount'] = pd.to_numeric(df['amount'], errors='coerce')
df['amount_missing'] = df['amount'].isna()
df = df.drop(columns=['notes'])
os.makedirs('/workspace/output', exist_ok=True)
df.to_csv('/workspace/output/clean.csv', index=False)
print(len(df))"""
EVIL_TASK = "Clean sales.csv <script>alert('x')</script> & keep | pipes"


def script(code: str, answer: str) -> list:
    return [
        {"content": "Thought: clean it.", "tool_calls": [{"name": "python", "arguments": {"code": code}}]},
        {"content": f"Final Answer: {answer}"},
    ]  # fmt: skip


class Page(HTMLParser):
    """The tags, and the text of every element, of a page as a browser's parser sees it."""

    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def parsed(path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def md_rows(path) -> list[str]:
    """The job rows of report.md's table (header and rule left out)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("| ")]
    return lines[1:]


@pytest.mark.docker
@pytest.mark.timeout(400)
@pytest.mark.xdist_group("run")
def test_a_batch_writes_each_jobs_audit_and_rewrites_the_report_as_each_job_ends(tmp_path):
    (tmp_path / "sales.csv").write_text(MESSY)
    (tmp_path / "clean.json").write_text(json.dumps(script(CLEAN, "4 rows left.")))
    slow = "import time\ntime.sleep(6)\nprint('done')"
    (tmp_path / "slow.json").write_text(json.dumps(script(slow, "slept.")))
    jobs = [
        {"id": "clean", "task": EVIL_TASK, "inputs": ["sales.csv"], "replay": "clean.json"},
        {"id": "slow", "task": "sleep a while", "replay": "slow.json"},
    ]
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("".join(json.dumps(j) + "\n" for j in jobs))
    out = tmp_path / "out"
    proc = sandcell_process(
        "batch", str(jobs_file), "--output", str(out), "--workers", "1", "--no-progress"
    )
    report_md = out / "report.md"
    # the first job's row is there while the second job still sleeps: rewritten as a job ends
    wait_for(lambda: report_md.exists() and md_rows(report_md), 240, "the first job's row")
    first = md_rows(report_md)
    assert len(first) == 1 and first[0].startswith("| clean |"), first
    assert lines_in(out / "results.jsonl") == 1
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    rows = md_rows(report_md)
    assert [r.split(" | ")[0] for r in rows] == ["| clean", "| slow"]
    # id, task (escaped: no HTML and no extra column), status, checks (none declared), rows
    cells = [c.strip() for c in rows[0].split(" | ")]
    assert (
        cells[1] == "Clean sales.csv &lt;script&gt;alert('x')&lt;/script&gt; &amp; keep \\| pipes"
    )
    assert cells[2:6] == ["answered", "—", "6", "4"], cells
    assert "[audit.json](clean/audit.json)" in rows[0]
    assert "[output/clean.csv](clean/output/clean.csv)" in rows[0]

    # the audit: row counts, the duplicates removed, columns added/removed/retyped, nulls
    audit = json.loads((out / "clean" / "audit.json").read_text())
    (sales,) = audit["inputs"]
    assert (sales["path"], sales["rows"], sales["duplicate_rows"]) == ("sales.csv", 6, 2)
    by_name = {c["name"]: c for c in sales["columns"]}
    assert by_name["amount"] == {"name": "amount", "dtype": "string", "nulls": 2, "distinct": 3, "distinct_at_least": False}  # fmt: skip
    assert (by_name["id"]["distinct"], by_name["notes"]["nulls"]) == (4, 2)
    (clean,) = audit["outputs"]
    assert (clean["path"], clean["rows"], clean["duplicate_rows"]) == ("output/clean.csv", 4, 0)
    (changed,) = audit["changes"]
    assert changed["matched_by"] == "only input" and changed["exact"]
    assert (changed["rows_in"], changed["rows_out"], changed["duplicates_removed"]) == (6, 4, 2)
    assert changed["columns_added"] == ["amount_missing"]
    assert changed["columns_removed"] == ["notes"]
    assert changed["columns_retyped"] == [{"column": "amount", "from": "string", "to": "float"}]
    assert changed["nulls"]["amount"] == {"before": 2, "after": 2}
    assert changed["nulls"]["amount_missing"] == {"before": None, "after": 0}
    assert audit["summary"] == {"rows_in": 6, "rows_out": 4, "exact": True}
    answer = (out / "clean" / "answer.md").read_text()
    assert answer.startswith("4 rows left.") and "\n## Audit\n" in answer
    assert "rows 6 -> 4; 2 duplicate rows removed; added amount_missing; removed notes" in answer
    slow_audit = json.loads((out / "slow" / "audit.json").read_text())
    assert slow_audit["inputs"] == slow_audit["outputs"] == [] and slow_audit["summary"]["rows_in"] is None  # fmt: skip

    # report.html: parsed as HTML, no script element; the task shown as text, escaped
    page = parsed(out / "report.html")
    assert "script" not in page.tags
    assert EVIL_TASK in page.text
    assert "<script>" not in (out / "report.html").read_text()
    html_before = (out / "report.html").read_text()

    # `sandcell report DIR` makes both again from results.jsonl
    (out / "report.html").unlink()
    report_md.unlink()
    rebuilt = sandcell("report", str(out))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert rebuilt.stdout.split() == ["wrote", str(out / "report.html"), "wrote", str(report_md)]
    assert md_rows(report_md) == rows
    assert _unstamped((out / "report.html").read_text()) == _unstamped(html_before)
    assert not list(out.glob(".report*"))  # no temporary file left


def _unstamped(html: str) -> str:
    return "\n".join(ln for ln in html.splitlines() if not ln.startswith('<p class="made">'))


def test_report_of_a_folder_that_is_not_a_batch_is_a_usage_error(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(main, ["report", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2
    assert "is not a folder; give the --output folder of a batch" in missing.stderr
    empty = runner.invoke(main, ["report", str(tmp_path)])
    assert empty.exit_code == 2
    assert "has no results.jsonl; give the --output folder of a `sandcell batch` run" in (
        empty.stderr
    )


def test_report_rows_of_failed_checks_and_missing_audits(tmp_path):
    """A results line's `checks` (written by the checks step): its first failures shown."""
    failures = [f"amount: greater_than(0) failed for {i}" for i in range(5)]
    records = [
        {"id": "a", "task": "t", "status": "stopped", "stop_reason": "checks_failed",
         "steps": 4, "tokens": 100, "duration_s": 2.5,
         "checks": {"passed": False, "outputs": {"out.csv": {"passed": False, "sha256": "0" * 64, "failures": failures}}}},
        {"id": "b", "task": "t", "status": "answered", "stop_reason": "answered", "steps": 2,
         "tokens": 50, "duration_s": 1.0, "checks": {"passed": True, "outputs": {}}},
    ]  # fmt: skip
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = md_rows(tmp_path / "report.md")
    a, b = ([c.strip() for c in r.split(" | ")] for r in rows)
    assert a[2] == "stopped: checks_failed"
    assert a[3] == "failed<br>" + "<br>".join(
        [f"out.csv: {f}" for f in failures[:3]] + ["… 2 more in answer.md"]
    )
    assert a[4:9] == ["—", "—", "4", "100", "2.5"]
    assert b[3] == "passed"
    text = (tmp_path / "report.md").read_text()
    assert "**2 jobs**: 1 answered, 1 stopped, 0 failed; checks 1 passed, 1 failed, 0 none" in text
    assert "6 model calls, 150 tokens, 3.5 s." in text


def test_distinct_values_and_duplicate_rows_keep_to_their_caps():
    text = "k,v\n" + "".join(f"{i},{i % 3}\n" for i in range(10)) + "0,0\n1,1\n"
    counted = tables.parse_table(text, ",", time.monotonic() + 5, True, distinct=100)
    assert [len(c.values) for c in counted.columns] == [10, 3]
    assert (counted.duplicate_rows, counted.duplicates_more) == (2, False)
    capped = tables.parse_table(text, ",", time.monotonic() + 5, True, distinct=4)
    assert [(len(c.values), c.distinct_more) for c in capped.columns] == [(4, True), (3, False)]
    # rows past the cap are not held: only repeats of the first 4 rows are found
    assert (capped.duplicate_rows, capped.duplicates_more) == (2, True)
    plain = tables.parse_table(text, ",", time.monotonic() + 5, True)
    assert plain.duplicate_rows is None and plain.columns[0].values is None


def test_parquet_and_xlsx_outputs_get_distinct_values_and_duplicates(tmp_path):
    frame = pd.DataFrame({"id": [1, 2, 1, 3, None], "name": ["a", "b", "a", "c", None]})
    frame.to_parquet(tmp_path / "t.parquet")
    frame.to_excel(tmp_path / "t.xlsx", index=False)
    for name in ("t.parquet", "t.xlsx"):
        p = profile_file(tmp_path / name, name, Caps(distinct=100))
        assert (p.rows, p.duplicate_rows) == (5, 1), name
        assert [(c.name, c.nulls, c.distinct) for c in p.columns] == [
            ("id", 1, 3),
            ("name", 1, 3),
        ], name
        plain = profile_file(tmp_path / name, name)  # the prompt's profile counts no more
        assert plain.duplicate_rows is None and plain.columns[0].distinct is None


def test_an_input_over_the_read_cap_is_audited_from_its_head_and_the_audit_says_so(tmp_path):
    from sandcell.agent.jobs.audit import CAPS, audit
    from sandcell.sandbox.inputs import Inputs

    huge = tmp_path / "huge.csv"
    row = "1,some text that repeats,2.5\n"
    huge.write_text("id,text,x\n" + row * (CAPS.full_bytes // len(row) + 1000))
    started = time.monotonic()
    result = audit(Inputs.from_paths([huge]), [], tmp_path)
    assert time.monotonic() - started < 2 * CAPS.time_s  # only the first MiB was read
    (entry,) = result["inputs"]
    assert not entry["exact"] and entry["sha256"] is None
    assert entry["duplicates_at_least"] and entry["duplicate_rows"] > 0
    assert entry["notes"][0].startswith("over 16.0 MiB: profiled from its first 1.0 MiB")
    assert result["summary"]["exact"] is False and result["caps"]["full_bytes"] == CAPS.full_bytes


def test_the_audit_takes_a_jobs_inputs_as_plain_paths_too(tmp_path):
    """Job(id, task, [path]) as the Python API and the bench make it: not an Inputs."""
    from sandcell.agent.jobs.audit import audit

    (tmp_path / "sales.csv").write_text(MESSY)
    (entry,) = audit([tmp_path / "sales.csv"], [], tmp_path)["inputs"]
    assert (entry["path"], entry["rows"], entry["duplicate_rows"]) == ("sales.csv", 6, 2)
