"""The batch report: DIR/report.html and DIR/report.md, one row per job of DIR/results.jsonl.

Rebuilt from results.jsonl and each job's audit.json, so `sandcell report DIR` makes the same
page a batch writes as each job ends. Rendered with Jinja2, autoescaped: task texts, answers,
errors, check failures and file names come from users and models. The page needs no script
and nothing from the network (its CSS is inline); each file is replaced atomically, so a
browser or a reader never sees half a report."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import jinja2

from sandcell.agent.jobs.audit import AUDIT

RESULTS = "results.jsonl"  # agent.jobs.batch's name for it (batch imports this module)
LIBRARY = "recipes"  # the batch's library of recipes (agent.jobs.recipe_library keeps it)
HTML, MARKDOWN = "report.html", "report.md"
FIRST_FAILURES = 3  # check failures shown per job; the job's answer.md has them all
TEXT_CAP = 300  # characters of an error or failure shown in a cell
TASK_CAP = 160  # characters of a task in its cell (report.html has it whole as a tooltip)

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("sandcell.agent.jobs", "templates"),
    # on for report.html.j2 (a name select_autoescape(["html"]) would miss); report.md.j2
    # escapes its cells with the `md` filter
    autoescape=jinja2.select_autoescape(["html", "html.j2"]),
    undefined=jinja2.StrictUndefined,  # a typo in a template fails the tests, not silently
    trim_blocks=True,
    lstrip_blocks=True,
)


def _md(value: object) -> str:
    """A Markdown table cell: one line, no pipe or HTML tag that would break the table."""
    text = " ".join(str(value).split())
    for char, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|")):
        text = text.replace(char, escaped)
    return text


_env.filters["md"] = _md


class ReportError(ValueError):
    """DIR holds no batch results; the message says what is missing."""


def _cut(text: object, cap: int = TEXT_CAP) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= cap else text[: cap - 1] + "…"


def records(folder: Path) -> list[dict]:
    """The results lines, the last line of an id winning, ordered by id (jobs end in any
    order; a reader looks a job up); a torn last line (a batch killed mid-write) is left out,
    as a rerun does."""
    latest: dict[str, dict] = {}
    path = folder / RESULTS
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "id" in record:
            latest[str(record["id"])] = record
    return [latest[key] for key in sorted(latest)]


def _audit(job_dir: Path) -> dict | None:
    try:
        return json.loads((job_dir / AUDIT).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no audit (a failed job) or a broken one: no rows shown
        return None


def _href(job_id: str, relative: str) -> str:
    return quote(f"{job_id}/{relative}")


def _checks(record: dict) -> dict:
    checks = record.get("checks")
    if not isinstance(checks, dict):
        return {"state": "none", "text": "—", "failures": []}
    if checks.get("passed"):
        return {"state": "passed", "text": "passed", "failures": []}
    failures = []
    for path, out in (checks.get("outputs") or {}).items():
        if not isinstance(out, dict) or out.get("passed"):
            continue
        for failure in out.get("failures") or ["failed"]:
            text = failure if isinstance(failure, str) else json.dumps(failure, default=str)
            failures.append(_cut(f"{path}: {text}"))
    shown = failures[:FIRST_FAILURES]
    if len(failures) > len(shown):
        shown.append(f"… {len(failures) - len(shown)} more in answer.md")
    return {"state": "failed", "text": "failed", "failures": shown or ["failed"]}


def _status(record: dict) -> str:
    status = record.get("status", "?")
    if status == "answered":  # by a recipe with no model, or by the agent after one failed
        solved = record.get("solved_by")
        return f"answered by the {solved}" if solved else "answered"
    why = record.get("error") or record.get("detail")
    reason = record.get("stop_reason") or ""
    text = f"{status}: {reason}" if reason and reason != status else status
    return _cut(text + (f" ({why})" if why else ""))


def row(folder: Path, record: dict) -> dict:
    """One job's row: what the templates show of it."""
    job_id = str(record["id"])
    job_dir = folder / job_id
    audit = _audit(job_dir)
    summary = (audit or {}).get("summary") or {}
    links = [
        (name, _href(job_id, name))
        for name in ("answer.md", "notebook.ipynb", AUDIT)
        if (job_dir / name).is_file()
    ]
    for relative in record.get("files") or []:
        # names the model's code chose: only files inside the job's folder are linked
        if isinstance(relative, str) and not relative.startswith(("/", "..")):
            links.append((relative, _href(job_id, relative)))
    return {
        "id": job_id,
        "task": _cut(record.get("task", ""), TASK_CAP),
        "task_whole": _cut(record.get("task", ""), 4000),
        "status": record.get("status", "?"),
        "status_text": _status(record),
        "checks": _checks(record),
        "rows_in": summary.get("rows_in"),
        "rows_out": summary.get("rows_out"),
        "rows_exact": summary.get("exact", True),
        "duplicates_removed": sum(
            c.get("duplicates_removed") or 0 for c in (audit or {}).get("changes") or []
        ),
        "model_calls": record.get("steps"),
        "tokens": record.get("tokens"),
        "seconds": record.get("duration_s"),
        "links": links,
    }


def _sum(rows: list[dict], key: str) -> int | float:
    return sum(r[key] for r in rows if isinstance(r[key], (int, float)))


def totals(rows: list[dict], expected: int | None) -> dict:
    statuses = [r["status"] for r in rows]
    checks = [r["checks"]["state"] for r in rows]
    return {
        "jobs": len(rows),
        "expected": expected,
        "answered": statuses.count("answered"),
        "stopped": statuses.count("stopped"),
        "interrupted": statuses.count("interrupted"),
        "failed": statuses.count("failed"),
        "checks_passed": checks.count("passed"),
        "checks_failed": checks.count("failed"),
        "checks_none": checks.count("none"),
        "rows_in": _sum(rows, "rows_in"),
        "rows_out": _sum(rows, "rows_out"),
        "model_calls": _sum(rows, "model_calls"),
        "tokens": _sum(rows, "tokens"),
        "seconds": round(_sum(rows, "seconds"), 1),
    }


def recipe_groups(folder: Path, lines: list[dict]) -> list[dict]:
    """With recipes: the answered jobs grouped by what solved them, each recipe (linked when
    it is in the batch's library) with its jobs, most jobs first, then the agent's."""
    groups: dict[str, list[str]] = {}
    for record in lines:
        solved = record.get("solved_by")
        if record.get("status") != "answered" or not solved:
            continue
        name = str(record.get("recipe")) if solved == "recipe" else ""
        groups.setdefault(name, []).append(str(record["id"]))
    shown = []
    for name, jobs in sorted(groups.items(), key=lambda g: (g[0] == "", -len(g[1]), g[0])):
        kept = name and (folder / LIBRARY / name).is_file()
        shown.append({
            "name": name or "the agent",
            "href": quote(f"{LIBRARY}/{name}") if kept else None,
            "jobs": jobs,
        })  # fmt: skip
    return shown


def render(folder: Path, expected: int | None = None) -> tuple[str, str]:
    """(report.html, report.md) of the batch in `folder`; `expected`: how many jobs it has."""
    lines = records(folder)
    rows = [row(folder, r) for r in lines]
    context = {
        "recipes": recipe_groups(folder, lines),
        "drifts": [_cut(r["drift"], 1000) for r in lines if r.get("drift")],
        "rows": rows,
        "totals": totals(rows, expected),
        "folder": folder.name or str(folder),
        "made": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    return (
        _env.get_template("report.html.j2").render(context),
        _env.get_template("report.md.j2").render(context),
    )


def write(folder: Path, expected: int | None = None) -> tuple[Path, Path]:
    """Both reports rewritten in `folder`, each atomically (a temporary file, then replace)."""
    html, md = render(folder, expected)
    paths = folder / HTML, folder / MARKDOWN
    for path, text in zip(paths, (html, md), strict=True):
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would outlive the replace
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)  # not left behind; the error goes on
            raise
    return paths


def rebuild(folder: Path) -> tuple[Path, Path]:
    """`sandcell report DIR`: both reports made again from DIR/results.jsonl."""
    if not folder.is_dir():
        raise ReportError(f"{folder} is not a folder; give the --output folder of a batch")
    if not (folder / RESULTS).is_file():
        raise ReportError(
            f"{folder} has no {RESULTS}; give the --output folder of a `sandcell batch` run"
        )
    return write(folder)
