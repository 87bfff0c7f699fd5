"""sandcell against Podman's Docker-compatible API (Debian's podman 4.3; scripts/ensure-podman.sh
starts `podman system service` and copies Docker's images over): doctor, exec over either
transport, a `run` with a scripted model, and `sandcell image build` on Podman itself. The
escape battery, the return path and the rich-output caps run on Podman too (the podman
variant of their `transport` fixture)."""

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker
import pytest

from tests.cli_runner import sandcell
from tests.conftest import PODMAN_SOCKET, podman_problem
from tests.missing import cannot_run
from tests.scripted_server import ScriptedServer
from tests.serve_helpers import python

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("podman")]
BUILT = "sandcell-podman-build:latest"


@pytest.fixture(scope="module")
def podman_env() -> dict[str, str]:
    problem = podman_problem()
    if problem is not None:
        cannot_run(problem, "Podman test")
    return {**os.environ, "DOCKER_HOST": f"unix://{PODMAN_SOCKET}"}


@pytest.mark.timeout(60)
def test_the_script_that_starts_podman_s_service_leaves_no_one_holding_its_output(podman_env):
    """CI reads `make test`'s output through a pipe and ends when the pipe does: a shell left
    waiting on the service it started, holding that pipe, kept CI's run going past its hour.
    The service runs from / too (its conmon needs a working directory that stays). dockerd is
    started by the same `start_daemon` (scripts/daemon.sh)."""
    folder = Path(tempfile.mkdtemp(prefix="podsock", dir="/tmp"))  # a socket's path is short
    sock = folder / "podman.sock"
    script = Path(__file__).parents[1] / "scripts" / "ensure-podman.sh"
    env = {**podman_env, "PODMAN_SOCK": str(sock)}
    started = subprocess.Popen(
        ["bash", str(script)], cwd=folder, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = started.communicate(timeout=30)  # to the pipe's end, not the script's
        assert started.returncode == 0 and f"API is up on {sock}" in output, output
        (service,) = subprocess.run(
            ["pgrep", "-f", f"unix://{sock}"], capture_output=True, text=True
        ).stdout.split()
        assert os.readlink(f"/proc/{service}/cwd") == "/"
    finally:
        started.kill()
        subprocess.run(["pkill", "-f", f"unix://{sock}"], check=False)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(180)
def test_doctor_names_podman_and_exec_runs_over_either_transport(podman_env, tmp_path):
    doctor = sandcell("doctor", env=podman_env, timeout=90)
    assert "ok  engine    Podman 4." in doctor.stdout, doctor.stdout
    assert "takes no runtime: no gVisor" in doctor.stdout
    # ipc (its probe's container saw the folder), or stream where the probe could not run
    assert re.search(r"ok  transport (ipc|stream): the engine at unix:///run/podman", doctor.stdout)
    data = tmp_path / "in.csv"
    data.write_text("a\n1\n2\n")
    for way in ("auto", "stream"):
        done = sandcell(
            "exec", "--transport", way, "--input", str(data),
            "-c", "import pandas as pd; print(pd.read_csv('/data/in.csv').a.sum())",
            env=podman_env, timeout=90,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip() == "3", (way, done.stdout, done.stderr)
    stuck = sandcell("exec", "--timeout", "3", "-c", "while True: pass", env=podman_env, timeout=90)
    # the message gives the cell's measured time: its 3 s and the interrupt (more under load)
    took = re.search(r"Timed out after (\d+) s", stuck.stdout)
    assert stuck.returncode == 124 and took and int(took[1]) >= 3, stuck.stdout
    refused = sandcell("exec", "--runtime", "runsc", "-c", "1", env=podman_env, timeout=60)
    assert refused.returncode == 3 and "Podman's Docker API takes no runtime" in refused.stderr


@pytest.mark.timeout(180)
def test_a_run_with_a_scripted_model_answers_on_podman(podman_env, tmp_path):
    data = tmp_path / "sales.csv"
    data.write_text("region,units\nN,3\nS,4\nN,5\n")
    code = "import pandas as pd\nprint(pd.read_csv('/data/sales.csv').groupby('region').units.sum().idxmax())"

    def answer(body: dict) -> str:
        return f"Most units: {body['messages'][-1]['content'].strip()}."

    with ScriptedServer([python(code), answer]) as server:
        done = sandcell(
            "run", "--task", "Which region sold most?", "--input", str(data),
            "--base-url", server.url, "--api-key", "k", "--model", "m", "--protocol", "tools",
            "--transport", "stream", "--output", str(tmp_path / "out"), "--vision", "off",
            env=podman_env, timeout=150,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Most units: N." in done.stdout
    final = [json.loads(line) for line in (tmp_path / "out" / "trace.jsonl").open()][-1]
    assert final["type"] == "final" and final["stop_reason"] == "answered"


@pytest.mark.timeout(900)
def test_image_build_on_podman_makes_the_image_docker_has(podman_env):
    """The build streams its context through Podman's API and finds the base it has (Docker's,
    copied over, as a fresh Podman machine's would be made): the same hash as Docker's image,
    and a sandbox of it runs."""
    env = {**podman_env, "SANDCELL_IMAGE": BUILT}
    podman = docker.DockerClient(base_url=podman_env["DOCKER_HOST"], timeout=60)
    try:
        done = sandcell("image", "build", env=env, timeout=850)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        want = docker.from_env().images.get("sandcell-sandbox:latest").labels["sandcell.hash"]
        assert podman.images.get(BUILT).labels["sandcell.hash"] == want
        ran = sandcell("exec", "-c", "print(1 + 1)", env=env, timeout=90)
        assert ran.returncode == 0 and ran.stdout.strip() == "2", ran.stderr
    finally:
        try:
            podman.images.remove(BUILT, force=True)
        except docker.errors.APIError:
            pass
