"""`sandcell exec` and `sandcell gc` from the shell: output and exit statuses."""

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from sandcell.agent.cli import main
from tests.cli_runner import sandcell


def test_usage_error_exits_2():
    result = CliRunner().invoke(main, ["exec"], prog_name="sandcell")  # in-process: no sandbox
    assert result.exit_code == 2
    assert result.stderr.startswith("Usage: sandcell exec [OPTIONS] [FILE]")
    assert "Error: give the code either with -c CODE or as FILE (- for stdin)" in result.stderr


@pytest.mark.docker  # asks the engine for the image
def test_missing_image_exits_3_and_says_what_to_run():
    """A subprocess, because SANDCELL_IMAGE is read when the sandbox package loads."""
    env = dict(os.environ, SANDCELL_IMAGE="sandcell-no-such-image:0")
    result = sandcell("exec", "-c", "1", env=env)
    assert result.returncode == 3
    assert result.stderr.startswith("sandcell: ")
    assert "sandcell image build" in result.stderr and "sandcell doctor" in result.stderr
    assert "Traceback" not in result.stderr


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
    raised = sandcell("exec", "-c", "print('hi'); 1/0")
    assert raised.returncode == 1 and "ZeroDivisionError" in raised.stdout
    # what the cell printed, once: live as it ran, not again with the traceback
    assert raised.stdout.splitlines().count("hi") == 1, raised.stdout
    assert raised.stdout.startswith("hi\n"), raised.stdout
    timed = sandcell("exec", "--timeout", "2", "-c", "while True: pass")
    assert timed.returncode == 124 and "Timed out" in timed.stdout
    died = sandcell("exec", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert died.returncode == 137 and "restarted" in died.stdout
    piped = sandcell("exec", "--json", "-", input="print('hi')\n2 + 3")
    record = json.loads(piped.stdout)
    assert piped.returncode == 0
    assert (
        record["stream"][0]["text"] == "hi\n" and record["results"][0]["data"]["text/plain"] == "5"
    )


ORPHAN = (
    "import json, os\nfrom sandcell import DockerSandbox, Limits\n"
    "box = DockerSandbox(limits=Limits())\n"
    "print(json.dumps({'id': box.container.id, 'conn': box.conn_dir}), flush=True)\n"
    "os._exit(0)\n"  # dies without cleaning up: its container is an orphan
)


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_gc_removes_an_orphan_and_names_it():
    """Every sandbox start reaps orphans too, so another test worker may remove ours first;
    then try again with a new one. gc must name the orphan it removed at least once."""
    import docker

    client = docker.from_env()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outputs = []
    for _ in range(3):
        made = subprocess.run(
            [sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=120, cwd=root
        )
        assert made.returncode == 0, made.stderr
        info = json.loads(made.stdout.strip().splitlines()[-1])
        try:
            result = CliRunner().invoke(main, ["gc"])  # in-process: no start-up delay
            assert result.exit_code == 0, result.output
            outputs.append(result.output)
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(info["id"])  # gone, whoever removed it
            assert not os.path.exists(info["conn"])  # and its host folder with it
        finally:
            try:
                client.containers.get(info["id"]).remove(force=True)
            except docker.errors.NotFound:
                pass
            if os.path.isdir(info["conn"]):
                os.chmod(info["conn"], 0o755)
                subprocess.run(["rm", "-rf", info["conn"]], check=False)
        assert re.match(r"removed \d+ orphaned sandbox container\(s\)", result.output)
        if info["id"][:12] in result.output:
            return
    pytest.fail(f"gc never named the orphan it should have removed: {outputs}")
