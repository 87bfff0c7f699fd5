"""`--runtime` and SANDCELL_RUNTIME from the shell: the sandbox runs under the runtime asked
for, and one the engine lacks is exit 3 naming the make target, before any model is asked."""

import os
import subprocess
from pathlib import Path

import docker
import pytest

from sandcell.sandbox import SandboxUnavailable
from sandcell.sandbox import container as ctr
from tests import cli_runner
from tests.missing import cannot_run

DEMO = Path(__file__).parent.parent / "agent" / "demo"

pytestmark = pytest.mark.docker


def sandcell(*args, runtime_env: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "SANDCELL_RUNTIME"}
    if runtime_env is not None:
        env["SANDCELL_RUNTIME"] = runtime_env
    return cli_runner.sandcell(*args, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.timeout(120)
def test_exec_under_the_runtime_asked_for(runtime):
    uname = "import os; print(os.uname().release)"
    flag = sandcell("exec", "--runtime", runtime, "-c", uname)
    by_env = sandcell("exec", "-c", uname, runtime_env=runtime)
    for result in (flag, by_env):
        assert result.returncode == 0, result.stderr
        assert (result.stdout.strip() == os.uname().release) == (runtime == "runc"), result.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["exec", "run", "chat", "batch", "serve", "mcp"])
def test_unknown_runtime_exits_3_naming_the_make_target(command, tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        '{"id": "q1", "task": "say hi", "replay": "%s"}\n' % (DEMO / "clean_sales.json")
    )
    args = {
        "exec": ["exec", "-c", "1"],
        "run": ["run", "--task", "x", "--output", str(tmp_path / "out"), "--replay",
                str(DEMO / "clean_sales.json")],
        "chat": ["chat", "--output", str(tmp_path / "out"), "--replay",
                 str(DEMO / "clean_sales.json")],
        "batch": ["batch", str(jobs), "--output", str(tmp_path / "results")],
        "serve": ["serve", "--port", "0", "--data", str(tmp_path / "out"), "--replay",
                  str(DEMO / "clean_sales.json")],
        "mcp": ["mcp"],
    }[command]  # fmt: skip
    result = sandcell(*args, runtime_env="no-such-runtime")
    assert result.returncode == 3, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("sandcell: the Docker engine has no runtime 'no-such-runtime'"), line
    assert "make engine RUNTIME=runsc" in line and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was made (or served)


@pytest.mark.timeout(30)
def test_an_engine_whose_default_is_runsc_gives_gvisor_s_limits_without_asking():
    """A sandbox that asks for no runtime runs under the engine's default; when that is runsc,
    its limits must be gVisor's (at runc's pids limit the Sentry ran out of threads)."""
    info = docker.from_env().info()
    if "runsc" not in (info.get("Runtimes") or {}):
        cannot_run("the engine has no runsc runtime (run `make engine RUNTIME=runsc`)")
    assert ctr.runtime_is_gvisor({**info, "DefaultRuntime": "runsc"}, None) is True
    assert ctr.runtime_is_gvisor({**info, "DefaultRuntime": "runc"}, None) is False
    assert ctr.runtime_is_gvisor(info, "runsc") is True
    bare = {**info["Runtimes"], "runsc": {**info["Runtimes"]["runsc"], "runtimeArgs": []}}
    with pytest.raises(SandboxUnavailable, match="'runsc' .gVisor. is registered with no arg"):
        ctr.runtime_is_gvisor({**info, "Runtimes": bare, "DefaultRuntime": "runsc"}, None)
