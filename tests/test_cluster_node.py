"""The node's side of `serve --ray` without a cluster: what an actor leaves on its node's disk."""

import os
import subprocess
import sys
import tempfile

import pytest

from tests.missing import IN_CI

try:
    from sandcell.sandbox.cluster_node import SCRATCH, scratch_root
except ImportError:  # Ray is not installed (the module imports it)
    if IN_CI:
        raise
    pytest.skip("ray is not installed: pip install -e '.[ray]'", allow_module_level=True)


@pytest.mark.timeout(30)
def test_an_actor_removes_the_scratch_folders_of_node_actors_whose_process_is_gone(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"{SCRATCH}-{ended.stdout.strip()}-abc"
    (dead / "x1").mkdir(parents=True)
    (dead / "x1" / "paused.tar").write_bytes(b"left by a worker that died")
    live = tmp_path / f"{SCRATCH}-1-def"  # pid 1 lives as long as the machine
    live.mkdir()
    other = tmp_path / "not-ours-42"
    other.mkdir()

    root = scratch_root()
    assert not dead.exists() and live.exists() and other.exists()
    assert root.parent == tmp_path and root.name.startswith(f"{SCRATCH}-{os.getpid()}-")
