"""The host-container contract (sandbox/boundary.py): its markers round-trip, the image build
ships it (its hash changes when the contract does), and the image really carries this copy."""

import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox import boundary
from sandbox.kernel import Collector

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("source,count", [("stdout", 0), ("stderr", 12345), ("relay", 1 << 40)])
def test_dropped_marker_round_trips(source, count):
    text = "before" + boundary.dropped_marker(source, count) + "after"
    assert boundary.parse_dropped(text, "|") == ("before|after", count)


def test_parse_dropped_sums_several_markers_and_leaves_other_text_alone():
    text = boundary.dropped_marker("stdout", 5) + "x\n" + boundary.dropped_marker("relay", 7)
    assert boundary.parse_dropped(text) == ("x\n", 12)
    plain = "no marker here\n\x1b[31mred\x1b[0m [sandcell-dropped stdout 3]"
    assert boundary.parse_dropped(plain) == (plain, 0)


def test_the_host_collector_reads_what_the_container_writes():
    collector = Collector("code", cap=1000)
    msg = {"msg_type": "stream", "content": {"name": "stdout", "text": "a" + boundary.dropped_marker("stdout", 99) + "b"}}  # fmt: skip
    collector.add(msg)
    execution = collector.finish(0.1)
    assert execution.dropped_bytes == 99
    assert execution.stdout == "a\n[... output cut by the sandbox ...]\nb"


def _build_hash(tree: Path) -> str:
    done = subprocess.run(
        ["bash", str(tree / "images" / "build.sh"), "--hash"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_image_build_copies_the_contract_and_hashes_it(tmp_path):
    """A copy of the build folder and the contract, so the real files are never touched."""
    shutil.copytree(ROOT / "images", tmp_path / "images", ignore=shutil.ignore_patterns(".wheels"))
    (tmp_path / "sandbox").mkdir()
    contract = tmp_path / "sandbox" / "boundary.py"
    shutil.copy(ROOT / "sandbox" / "boundary.py", contract)
    before = _build_hash(tmp_path)
    assert (tmp_path / "images" / "boundary.py").read_bytes() == contract.read_bytes()
    assert _build_hash(tmp_path) == before  # nothing changed: the same hash
    contract.write_text(contract.read_text() + "\nEXTRA = 1\n")
    assert _build_hash(tmp_path) != before
    assert "EXTRA = 1" in (tmp_path / "images" / "boundary.py").read_text()
    dockerfile = (tmp_path / "images" / "Dockerfile").read_text()
    assert any(
        line.startswith("COPY ") and "boundary.py" in line and boundary.SCRIPTS in line
        for line in dockerfile.splitlines()
    )


def test_image_programs_use_the_contract_not_their_own_literals():
    """The strings the contract names appear in no image program or host module but it."""
    literals = ["sandcell-dropped", "/run/sandcell", "sandcell/path", "sandcell/error", "SIGUSR"]
    sources = [*(ROOT / "images").glob("*.py"), *(ROOT / "sandbox").glob("*.py")]
    for path in sources:
        if path.name == "boundary.py":
            continue
        text = path.read_text()
        assert [s for s in literals if s in text] == [], path


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_the_image_carries_this_contract(image):
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", image,
         f"{boundary.SCRIPTS}/boundary.py"],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout == (ROOT / "sandbox" / "boundary.py").read_bytes(), (
        "the image is older than sandbox/boundary.py: run `make image`"
    )
