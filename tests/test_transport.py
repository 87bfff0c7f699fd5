"""Which transport `auto` takes (sandbox/transport.py), against the real engine: ipc on the
local socket, stream over TCP, and stream from a process whose folders the engine cannot see
(a mount namespace of its own, as a client on another machine is); `exec` and a refused ipc
from the command line."""

import os
import shutil
import subprocess
import sys

import docker
import pytest

from sandcell.sandbox import transport
from sandcell.sandbox.container import DEFAULT_IMAGE
from sandcell.sandbox.errors import SandboxUnavailable
from tests.cli_runner import sandcell

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120)]
ROOT = os.path.dirname(os.path.dirname(__file__))


def test_auto_is_ipc_on_the_local_socket_and_stream_over_tcp(tcp_engine, monkeypatch):
    local = transport.choose(docker.from_env(), "auto", DEFAULT_IMAGE)
    assert local.name == "ipc" and "sees this machine's folders" in local.why
    monkeypatch.setenv("DOCKER_HOST", tcp_engine)
    remote = docker.from_env()
    chosen = transport.choose(remote, "auto", DEFAULT_IMAGE)
    assert chosen == transport.Choice("stream", f"the engine is remote ({tcp_engine})")
    with pytest.raises(SandboxUnavailable, match="--transport ipc needs a local engine"):
        transport.choose(remote, "ipc", DEFAULT_IMAGE)


PROBE = """
from sandcell.sandbox import transport
import docker
print(transport.choose(docker.from_env(), "auto", "{image}"))
"""


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("unshare"), reason="needs root's unshare")
def test_auto_is_stream_where_the_engine_cannot_see_the_folder_the_client_made(tmp_path):
    """A client whose temporary folders are its own (a fresh tmpfs mounted in a mount
    namespace of its own) is a client the engine cannot see, though it talks to the local
    socket: the probe finds it."""
    private = tmp_path / "private"
    private.mkdir()
    script = PROBE.format(image=DEFAULT_IMAGE)
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", 'mount -t tmpfs none "$0" && exec "$1" -c "$2"',
         str(private), sys.executable, script],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "TMPDIR": str(private)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "Choice(name='stream', why=\"the engine at unix:///var/run/docker.sock cannot see "
        in done.stdout
    )


def test_exec_over_a_remote_engine_runs_with_its_input_and_ipc_there_is_exit_3(
    tcp_engine, tmp_path
):
    data = tmp_path / "in.csv"
    data.write_text("a,b\n1,2\n")
    env = {**os.environ, "DOCKER_HOST": tcp_engine}
    done = sandcell(
        "exec", "--input", str(data), "-c", "print(open('/data/in.csv').read().split())", env=env
    )
    assert done.returncode == 0, done.stderr
    assert "['a,b', '1,2']" in done.stdout
    refused = sandcell("exec", "--transport", "ipc", "-c", "1", env=env)
    assert refused.returncode == 3
    assert "--transport ipc needs a local engine" in refused.stderr
