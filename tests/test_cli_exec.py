"""`sandcell exec` and `sandcell gc` from the shell: output and exit statuses."""

import json
import subprocess
import sys

import pytest

SANDCELL = [sys.executable, "-m", "agent.cli"]


def sandcell(*args, stdin=None, env=None):
    return subprocess.run(
        [*SANDCELL, *args], input=stdin, capture_output=True, text=True, timeout=120, env=env
    )


def test_usage_error_exits_2():
    result = sandcell("exec")
    assert result.returncode == 2
    assert "-c CODE" in result.stderr


def test_missing_image_exits_3_and_says_what_to_run(monkeypatch):
    import os

    env = dict(os.environ, SANDCELL_IMAGE="sandcell-no-such-image:0")
    result = sandcell("exec", "-c", "1", env=env)
    assert result.returncode == 3
    assert "make image" in result.stderr or "make engine" in result.stderr


@pytest.mark.docker
@pytest.mark.timeout(120)
@pytest.mark.xdist_group("cli")
def test_exec_statuses(tmp_path):
    data = tmp_path / "numbers.csv"
    data.write_text("n\n1\n2\n3\n")
    ok = sandcell(
        "exec",
        "--input",
        str(data),
        "-c",
        "import pandas as pd; print(pd.read_csv('/data/numbers.csv').n.sum())",
    )
    assert (ok.returncode, ok.stdout.strip()) == (0, "6")
    raised = sandcell("exec", "-c", "1/0")
    assert raised.returncode == 1 and "ZeroDivisionError" in raised.stdout
    timed = sandcell("exec", "--timeout", "2", "-c", "while True: pass")
    assert timed.returncode == 124 and "Timed out" in timed.stdout
    died = sandcell("exec", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert died.returncode == 137 and "restarted" in died.stdout
    piped = sandcell("exec", "--json", "-", stdin="print('hi')\n2 + 3")
    record = json.loads(piped.stdout)
    assert piped.returncode == 0
    assert (
        record["stream"][0]["text"] == "hi\n" and record["results"][0]["data"]["text/plain"] == "5"
    )


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_gc_answers():
    result = sandcell("gc")
    assert result.returncode == 0 and "orphaned sandbox container" in result.stdout
