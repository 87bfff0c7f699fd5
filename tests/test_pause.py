"""Pausing a sandbox under gVisor (issue 40): its container checkpointed into a folder, removed,
and restored into a new container with the kernel as it was (real runsc containers, the
engine's own checkpoints). Under runc a pause is refused and the sandbox runs on."""

from __future__ import annotations

import stat

import docker
import pytest

from sandcell.sandbox import DockerSandbox, Limits, checkpoint
from sandcell.sandbox import container as ctr
from tests.conftest import docker_problem, runtime_problem
from tests.missing import cannot_run

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

STATE = r"""
import random, sys, os, pandas as pd, numpy as np
import statistics  # an import the restored kernel must still have
df = pd.DataFrame({"a": np.arange(1_000_000), "b": np.random.default_rng(7).random(1_000_000)})
drawn = random.random()
open("/workspace/kept.txt", "w").write("in the workspace")
open("/tmp/kept.txt", "w").write("in tmp")
print(drawn)
"""


def checkpoints_problem() -> str | None:
    """Why this engine cannot checkpoint a runsc container (None: it can)."""
    problem = docker_problem() or runtime_problem("runsc")
    if problem:
        return problem
    if not docker.from_env().info().get("ExperimentalBuild"):
        return 'the engine has no "experimental": true (`make engine RUNTIME=runsc` sets it as it starts dockerd)'
    return None


@pytest.fixture
def runsc():
    problem = checkpoints_problem()
    if problem:
        cannot_run(problem, "checkpoint test")
    return Limits(timeout_s=120, memory_mb=1024, runtime="runsc")


def test_a_paused_sandbox_resumes_in_a_new_container_with_its_kernel_as_it_was(runsc, tmp_path):
    folder = tmp_path / "paused"
    with DockerSandbox(runsc) as sandbox:
        ex = sandbox.run(STATE)
        assert ex.error is None, ex.error
        drawn = ex.stdout.strip()
        total = sandbox.run("print(round(float(df.b.sum()), 6))").stdout.strip()
        old = sandbox.container.id
        sandbox.pause(folder)
        assert sandbox.closed
    with pytest.raises(docker.errors.NotFound):
        ctr.engine().containers.get(old)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in folder.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    with DockerSandbox(runsc, resume_from=folder) as back:
        assert back.container.id != old
        ex = back.run(
            "print(drawn, len(df), round(float(df.b.sum()), 6), 'statistics' in sys.modules,\n"
            "      open('/workspace/kept.txt').read(), open('/tmp/kept.txt').read())"
        )
        assert ex.error is None, ex.error
        fields = ex.stdout.split()
        assert fields[0] == drawn and fields[1] == "1000000" and fields[3] == "True", ex.stdout
        assert fields[2] == total, ex.stdout
        assert "in the workspace" in ex.stdout and "in tmp" in ex.stdout
        back.run("later = drawn * 2")
        back.pause(tmp_path / "again")  # a resumed sandbox pauses again
    with DockerSandbox(runsc, resume_from=tmp_path / "again") as twice:
        assert twice.run("later == drawn * 2 and len(df)").text == "1000000"


def test_a_tampered_checkpoint_is_refused(runsc, tmp_path):
    folder = tmp_path / "paused"
    with DockerSandbox(runsc) as sandbox:
        sandbox.run("x = 41")
        sandbox.pause(folder)
    victim = max(
        (p for p in (folder / checkpoint.SAVED).rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(checkpoint.PauseError, match="HMAC"):
        DockerSandbox(runsc, resume_from=folder)


def test_a_checkpoint_that_fails_is_said_and_leaves_nothing(runsc, tmp_path):
    # The kernel not readied: ipykernel's TCP listener stays open and waited on, which runsc
    # (2022-12) refuses to save. Such a failure has ended the whole gVisor sandbox here: the
    # pause then says so and leaves no folder and no container (a session falls back to its
    # recorded cells); should the sandbox survive it, it runs on with its state.
    with DockerSandbox(runsc) as sandbox:
        sandbox.run("x = 41")
        sandbox._in_kernel = lambda call: True
        container = sandbox.container.id
        with pytest.raises(checkpoint.PauseError, match="waiters upon save") as failed:
            sandbox.pause(tmp_path / "paused")
        assert not (tmp_path / "paused").exists()
        if "the sandbox ended" in str(failed.value):
            assert sandbox.closed
        else:
            del sandbox._in_kernel
            assert sandbox.run("x + 1").text == "42"
    with pytest.raises(docker.errors.NotFound):
        ctr.engine().containers.get(container)


def test_under_runc_a_pause_is_refused_and_the_sandbox_runs_on(tmp_path):
    problem = docker_problem()
    if problem:
        cannot_run(problem, "docker test")
    with DockerSandbox(Limits(runtime="runc")) as sandbox:
        sandbox.run("x = 41")
        with pytest.raises(checkpoint.PauseError, match="only a sandbox under gVisor"):
            sandbox.pause(tmp_path / "paused")
        assert sandbox.run("x + 1").text == "42"
        assert not (tmp_path / "paused").exists()
