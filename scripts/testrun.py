"""Run the suite so that CI tells a flaky test from a broken one, and say so at the end.

    testrun.py run REPORT [--rerun] -- PYTEST_ARGS...   pytest, JUnit report at REPORT
    testrun.py summary REPORT...                         the summary of those runs, last

`run` starts pytest with this file loaded as a plugin (`-p testrun`): on the controlling
process it writes each failed test report to REPORT's failures file (JSON Lines: node id
without xdist's `@group` suffix, the phase, pytest's crash line, the 1-minute load average as
the failure arrived). With --rerun and pytest's exit status 1, each failed test runs once more
in a new pytest process without -n (so alone, verbose), by its node id, reporting to
REPORT-rerun.xml; a test that passes there was flaky. More than MAX_RERUN failures are not
rerun: the build is broken. `summary` reads the reports and their failures files and prints,
each test counted once by its final outcome: the counts, each flaky test, each failed test.
Its exit status is 1 when a test failed for good or a report ran no test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

MAX_RERUN = 10
FAILURES_ENV = "SANDCELL_TESTRUN_FAILURES"  # where the plugin writes failed reports


# --- the plugin: loaded into pytest by `run` --------------------------------------------


def node_id(nodeid: str) -> str:
    """The node id pytest accepts: `--dist loadgroup` appends `@group`, which matches nothing."""
    head, sep, group = nodeid.rpartition("@")
    return head if sep and not any(c in group for c in "[]:/") else nodeid


def crash_line(report, limit: int = 300) -> str:
    """pytest's crash line (its short summary's: the message's first line), on one line and
    capped: an assertion's message may quote a whole output."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = (crash.message or "").partition("\n")[0]
    else:
        lines = str(report.longrepr or "").strip().splitlines()
        text = lines[-1] if lines else ""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_worker = False  # an xdist worker: its reports reach the controlling process, which writes


def pytest_configure(config) -> None:
    global _worker
    _worker = hasattr(config, "workerinput")


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get(FAILURES_ENV)
    if not report.failed or not path or _worker:
        return
    record = {
        "nodeid": node_id(report.nodeid),
        "when": report.when,
        "crash": crash_line(report),
        "load1": round(os.getloadavg()[0], 2),
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


# --- run -------------------------------------------------------------------------------------


def rerun_report(report: Path) -> Path:
    return report.with_name(f"{report.stem}-rerun{report.suffix}")


def failures_file(report: Path) -> Path:
    return report.with_name(f"{report.stem}-failures.jsonl")


def read_failures(report: Path) -> dict[str, dict]:
    """Node id -> its first failed report (a test failing in call and teardown counts once)."""
    failures: dict[str, dict] = {}
    path = failures_file(report)
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            failures.setdefault(record["nodeid"], record)
    return failures


def pytest(report: Path, args: list[str]) -> int:
    # a pytest of its own: nothing of an xdist worker this may run in (its tests) carries over
    worker = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")
    env = {k: v for k, v in os.environ.items() if k not in worker}
    env[FAILURES_ENV] = str(failures_file(report).resolve())
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-p", "testrun", f"--junitxml={report}", *args]
    return subprocess.run(command, env=env).returncode


def run(report: Path, rerun: bool, args: list[str]) -> int:
    for stale in (report, failures_file(report), rerun_report(report)):
        stale.unlink(missing_ok=True)
    failures_file(rerun_report(report)).unlink(missing_ok=True)
    status = pytest(report, args)
    failed = list(read_failures(report))
    if not rerun or status != 1 or not failed:
        return status
    if len(failed) > MAX_RERUN:
        print(f"testrun: {len(failed)} tests failed, more than {MAX_RERUN}: not rerun")
        return status
    print(f"testrun: {len(failed)} failed; each runs again alone (no -n): {' '.join(failed)}")
    return pytest(rerun_report(report), ["-v", *failed])


# --- summary ---------------------------------------------------------------------------------


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    xfailed: int = 0
    passed_cases: set[tuple[str, str]] = field(default_factory=set)  # (classname, name)
    flaky: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # failed tests, said after the flaky ones
    problems: list[str] = field(default_factory=list)

    @property
    def executed(self) -> int:
        return self.passed + self.failed + self.xfailed


def junit_case(nodeid: str) -> tuple[str, str]:
    """The (classname, name) JUnit gives the test `nodeid` (pytest's own mangling)."""
    path, *names = nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return ".".join([module, *names[:-1]]), names[-1] if names else ""


def outcomes(report: Path) -> Tally:
    """Counts of one JUnit report, one per test case."""
    tally = Tally()
    root = ET.parse(report).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            tally.failed += 1
        elif (skip := case.find("skipped")) is not None:
            if skip.get("type") == "pytest.xfail":
                tally.xfailed += 1
            else:
                tally.skipped += 1
        else:
            tally.passed += 1
            tally.passed_cases.add((case.get("classname", ""), case.get("name", "")))
    return tally


def summarize(report: Path, total: Tally) -> None:
    if not report.exists():
        total.problems.append(f"no report {report}: pytest did not finish")
        return
    tally = outcomes(report)
    failures = read_failures(report)
    again = rerun_report(report)
    if again.exists():
        failed_again, passed_alone = read_failures(again), outcomes(again).passed_cases
        for nodeid, first in failures.items():
            if nodeid in failed_again:
                total.lines.append(
                    f"failed: {nodeid} ({failed_again[nodeid]['crash']}; failed alone too)"
                )
                continue
            if junit_case(nodeid) not in passed_alone:  # not found, not run: not a pass
                total.lines.append(
                    f"failed: {nodeid} ({first['crash']}; the rerun did not pass it)"
                )
                continue
            tally.failed = max(0, tally.failed - 1)
            tally.passed += 1
            total.flaky.append(
                f"flaky: {nodeid} (failed in the parallel run: {first['crash']}; "
                f"load average {first['load1']} at the failure; passed alone)"
            )
    else:
        if len(failures) > MAX_RERUN:
            total.lines.append(
                f"not rerun: {len(failures)} tests failed, more than {MAX_RERUN}: the build is broken"
            )
        for nodeid, first in failures.items():
            total.lines.append(f"failed: {nodeid} ({first['crash']})")
        if tally.failed and not failures:  # a report without the plugin's records
            total.lines.append(f"failed: {tally.failed} tests in {report} (see its log)")
    if tally.executed == 0:
        total.problems.append(f"{report}: no test executed")
    for name in ("passed", "failed", "skipped", "xfailed"):
        setattr(total, name, getattr(total, name) + getattr(tally, name))


def summary(reports: list[Path]) -> int:
    total = Tally()
    for report in reports:
        summarize(report, total)
    print(
        f"summary: {total.executed} tests executed, {total.passed} passed, {total.failed} failed, "
        f"{total.skipped} skipped, {total.xfailed} xfailed"
    )
    for line in total.flaky + total.lines + total.problems:
        print(line)
    return 1 if total.failed or total.problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser(
        "run", help="run pytest; with --rerun, failed tests again alone"
    )
    run_parser.add_argument("report", type=Path)
    run_parser.add_argument("--rerun", action="store_true")
    summary_parser = commands.add_parser("summary", help="print the summary of the reports")
    summary_parser.add_argument("reports", type=Path, nargs="+")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    options, pytest_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    if options.command == "run":
        return run(options.report, options.rerun, pytest_args)
    return summary(options.reports)


if __name__ == "__main__":
    sys.exit(main())
