"""The foundation: the CLI answers, and the image runs a kernel reachable over a sealed
ipc connection directory with no network at all."""

import os
import stat
import subprocess
import sys
from importlib import metadata

import docker
import pytest
from click.testing import CliRunner
from jupyter_client import BlockingKernelClient

from sandcell.agent.cli import main
from sandcell.sandbox.container import remove_host_dirs
from sandcell.sandbox.kernel import make_connection_dir, seal
from tests.cli_runner import sandcell


def test_cli_version_and_help():
    runner = CliRunner()
    version = runner.invoke(main, ["--version"], prog_name="sandcell")
    assert version.exit_code == 0
    assert version.stdout.startswith(f"sandcell {metadata.version('sandcell')} (sandbox image")
    helped = runner.invoke(main, ["--help"], prog_name="sandcell")
    assert helped.exit_code == 0
    assert helped.stdout.startswith("Usage: sandcell [OPTIONS] COMMAND [ARGS]...")
    assert "sandbox" in helped.stdout and "Commands:" in helped.stdout


def test_python_dash_m_agent_cli_is_the_sandcell_command():
    done = sandcell("--help", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: sandcell [OPTIONS] COMMAND [ARGS]...")


@pytest.mark.docker
@pytest.mark.timeout(90)
def test_one_plus_one_through_a_sealed_ipc_kernel(image):
    client = docker.from_env()
    conn, info = make_connection_dir()  # host-owned, writable until sealed, ipc transport
    container = client.containers.run(
        image,
        detach=True,
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        volumes={conn: {"bind": "/run/sandcell", "mode": "rw"}},
        tmpfs={"/tmp": "size=64m", "/workspace": "size=64m,uid=1000,gid=1000"},
        labels={"sandcell.test": "foundation"},
    )
    kc = BlockingKernelClient()
    try:
        kc.load_connection_info(dict(info, ip=os.path.join(conn, "kernel")))
        kc.start_channels(hb=False)  # a heartbeat missed during a slow start is not a death
        kc.wait_for_ready(timeout=60)
        seal(conn)  # 0555: the kernel's uid can no longer create files here
        results = []
        reply = kc.execute_interactive(
            "1+1",
            timeout=30,
            output_hook=lambda m: (
                results.append(m["content"]) if m["msg_type"] == "execute_result" else None
            ),
        )
        assert reply["content"]["status"] == "ok"
        assert results[0]["data"]["text/plain"] == "2"
        reply = kc.execute_interactive("open('/run/sandcell/evil', 'w')", timeout=30)
        assert reply["content"]["ename"] == "PermissionError"
        assert stat.S_IMODE(os.stat(conn).st_mode) == 0o555
        container.reload()
        assert container.attrs["HostConfig"]["NetworkMode"] == "none"
    finally:
        kc.stop_channels()
        container.remove(force=True)
        remove_host_dirs(conn)
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(container.id)


@pytest.mark.timeout(60)
def test_the_kernel_clients_thread_loops_are_closed_at_exit_not_left_to_the_collector():
    """jupyter_client's blocking calls make an asyncio loop per calling thread (serve and MCP
    call sandboxes from worker threads); left open, the collector closes them at exit after
    their sockets and prints a traceback over a clean shutdown."""
    script = """
import atexit, threading
seen = []
atexit.register(lambda: print("closed" if seen[0].is_closed() else "open"))  # runs last
from sandcell.sandbox import event_loops
from jupyter_core.utils import ensure_event_loop, run_sync

event_loops.install()  # as each kernel connection does

async def nothing():
    return 1

def work():
    run_sync(nothing)()
    seen.append(ensure_event_loop())

thread = threading.Thread(target=work)
thread.start()
thread.join()
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert run.returncode == 0 and run.stdout.strip() == "closed", run.stdout + run.stderr
    assert "Exception ignored" not in run.stderr


@pytest.mark.timeout(60)
def test_importing_sandcell_leaves_the_programs_event_loop_policy_alone():
    """`import sandcell` changes nothing in the importing program; the noting policy goes in
    at the first kernel connection, and only in place of asyncio's default one (a program's
    own policy, uvloop's say, stays)."""
    script = """
import asyncio

class Own(asyncio.DefaultEventLoopPolicy):
    pass

default = asyncio.get_event_loop_policy()
import sandcell
from sandcell import Agent, DockerSandbox, Limits
print(asyncio.get_event_loop_policy() is default)
from sandcell.sandbox import event_loops
event_loops.install()
print(type(asyncio.get_event_loop_policy()).__name__)
asyncio.set_event_loop_policy(Own())
event_loops.install()
print(type(asyncio.get_event_loop_policy()).__name__)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert run.stdout.split() == ["True", "_NotingPolicy", "Own"], run.stdout + run.stderr
