"""The README's worked example (docs/verified-example: two messy vendor CSVs, their schema, the
jobs file) run as a real batch in real sandboxes, the model's replies scripted
(tests/data/report), and its report.html opened in Debian's chromium: no script, nothing
fetched, each row and link there. `SANDCELL_SCREENSHOT=1` renews docs/report.png."""

import json
import os
from pathlib import Path

import pytest

from tests.cli_runner import sandcell
from tests.missing import cannot_run
from tests.test_serve_page import CHROMIUM, CHROMIUM_ARGS, browser_problem

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "docs" / "verified-example"
REPLIES = Path(__file__).parent / "data" / "report"
SCREENSHOT = ROOT / "docs" / "report.png"


def example_jobs(tmp_path: Path) -> Path:
    """docs/verified-example/jobs.jsonl with each job's scripted replies added."""
    lines = []
    for line in (EXAMPLE / "jobs.jsonl").read_text().splitlines():
        job = json.loads(line)
        job["inputs"] = [str(EXAMPLE / name) for name in job["inputs"]]
        job["expect"] = {out: str(EXAMPLE / schema) for out, schema in job["expect"].items()}
        job["replay"] = str(REPLIES / f"{job['id']}.json")
        lines.append(json.dumps(job))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(lines) + "\n")
    return jobs


@pytest.mark.docker
@pytest.mark.browser
@pytest.mark.timeout(400)
@pytest.mark.xdist_group("run")
def test_the_worked_examples_report_opens_in_chromium_with_no_script(tmp_path):
    problem = browser_problem()
    if problem:
        cannot_run(problem, "browser test")
    from playwright.sync_api import sync_playwright

    out = tmp_path / "out"
    ran = sandcell("batch", str(example_jobs(tmp_path)), "--output", str(out), "--no-progress", timeout=380)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    audit = json.loads((out / "vendor-a" / "audit.json").read_text())
    (change,) = audit["changes"]
    assert (change["rows_in"], change["rows_out"], change["duplicates_removed"]) == (8, 6, 2)
    assert change["columns_removed"] == ["currency"] and change["columns_added"] == ["vendor"]

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 600})
            requests, errors = [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            url = (out / "report.html").as_uri()
            page.goto(url)
            assert page.locator("script").count() == 0
            rows = page.locator("tbody tr")
            assert rows.count() == 2
            first = rows.nth(0).locator("td")
            assert first.nth(0).inner_text() == "vendor-a"
            assert first.nth(2).inner_text() == "answered"
            assert [first.nth(i).inner_text() for i in (4, 5)] == ["8", "6\n2 duplicates removed"]
            links = rows.nth(0).locator("td.links a")
            assert links.all_inner_texts() == [
                "answer.md",
                "notebook.ipynb",
                "audit.json",
                "output/clean.csv",
            ]
            for href in [links.nth(i).get_attribute("href") for i in range(links.count())]:
                assert (out / href).is_file(), href  # every link points at a file there
            assert requests == [url] and errors == []  # nothing fetched, nothing ran
            # the README's picture: `SANDCELL_SCREENSHOT=1 make test` renews docs/report.png
            shot = SCREENSHOT if os.environ.get("SANDCELL_SCREENSHOT") else tmp_path / "r.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:4] == b"\x89PNG"
        finally:
            browser.close()
