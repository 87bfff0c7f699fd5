"""scripts/testrun.py, the way `make test` runs the suite: failed tests run again alone, a test
that passes then is reported flaky (counted once), one that fails again fails the run. Driven
on a throwaway test module in its own folder, with real pytest and xdist processes."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "testrun.py"

THROWAWAY = textwrap.dedent(
    """
    import json, os, pathlib
    import pytest

    HERE = pathlib.Path(__file__).parent

    def test_passes():
        pass

    def test_flaky():
        attempts = HERE / "flaky-attempts.jsonl"
        first = not attempts.exists()
        with attempts.open("a") as out:
            out.write(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")
        assert not first, "first attempt fails"

    def test_broken():
        assert 1 == 2, "always broken"

    def test_skipped():
        pytest.skip("not here")

    @pytest.mark.xfail(reason="known")
    def test_known_failure():
        assert False
    """
)


def run(folder: Path, *pytest_args: str, rerun: bool = True) -> subprocess.CompletedProcess:
    (folder / "pytest.ini").write_text("[pytest]\n")  # this folder is pytest's rootdir
    command = [sys.executable, str(SCRIPT), "run", "report.xml"]
    command += ["--rerun"] if rerun else []
    command += ["--", "-n", "2", "-p", "no:cacheprovider", *pytest_args]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=100)


def summary(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "summary", "report.xml"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.timeout(180)
def test_a_flaky_test_passes_alone_and_a_broken_one_fails_the_run(tmp_path):
    (tmp_path / "test_throwaway.py").write_text(THROWAWAY)
    ran = run(tmp_path)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    # both failures ran again in one serial, verbose pytest: the broken one failed there too
    assert "each runs again alone" in ran.stdout
    assert "test_throwaway.py::test_broken FAILED" in ran.stdout
    attempts = [json.loads(line) for line in (tmp_path / "flaky-attempts.jsonl").open()]
    assert len(attempts) == 2
    assert attempts[0]["worker"] in ("gw0", "gw1")  # the parallel run's worker
    assert attempts[1]["worker"] is None  # the second attempt: no xdist worker, alone
    assert (tmp_path / "report-rerun.xml").exists()

    said = summary(tmp_path)
    assert said.returncode == 1
    lines = said.stdout.splitlines()
    # five tests, each counted once by its final outcome: the flaky one passed
    assert lines[0] == "summary: 4 tests executed, 2 passed, 1 failed, 1 skipped, 1 xfailed"
    flaky = [line for line in lines if line.startswith("flaky: ")]
    assert len(flaky) == 1
    assert flaky[0].startswith(
        "flaky: test_throwaway.py::test_flaky (failed in the parallel run: "
        "AssertionError: first attempt fails"
    )
    assert "; load average " in flaky[0] and flaky[0].endswith(" at the failure; passed alone)")
    failed = [line for line in lines if line.startswith("failed: ")]
    assert failed == [
        "failed: test_throwaway.py::test_broken (AssertionError: always broken; failed alone too)"
    ]


@pytest.mark.timeout(180)
def test_only_flaky_failures_pass_the_run(tmp_path):
    module = "\n".join(line for line in THROWAWAY.splitlines() if "1 == 2" not in line)
    (tmp_path / "test_throwaway.py").write_text(module.replace("def test_broken():", ""))
    ran = run(tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    said = summary(tmp_path)
    assert said.returncode == 0, said.stdout
    assert said.stdout.splitlines()[0] == (
        "summary: 3 tests executed, 2 passed, 0 failed, 1 skipped, 1 xfailed"
    )


@pytest.mark.timeout(180)
def test_more_than_ten_failures_are_not_rerun(tmp_path):
    (tmp_path / "test_many.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('n', range(11))\n"
        "def test_fails(n):\n    assert n < 0\n"
    )
    ran = run(tmp_path)
    assert ran.returncode == 1
    assert "more than 10: not rerun" in ran.stdout
    assert not (tmp_path / "report-rerun.xml").exists()
    said = summary(tmp_path)
    assert said.returncode == 1
    assert said.stdout.splitlines()[:2] == [
        "summary: 11 tests executed, 0 passed, 11 failed, 0 skipped, 0 xfailed",
        "not rerun: 11 tests failed, more than 10: the build is broken",
    ]


@pytest.mark.timeout(60)
def test_a_report_that_ran_nothing_fails_the_summary(tmp_path):
    (tmp_path / "test_empty.py").write_text("")
    ran = run(tmp_path, rerun=False)
    assert ran.returncode == 5  # pytest's own "no tests collected"
    said = summary(tmp_path)
    assert said.returncode == 1
    assert "report.xml: no test executed" in said.stdout
