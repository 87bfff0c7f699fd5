"""The host-container contract (sandbox/boundary.py): its markers round-trip, the image build
ships it (its hash changes when the contract does), and the image really carries this copy."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox import boundary
from sandbox.execution import CUT_NOTE
from sandbox.kernel import Collector

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("source,count", [("stdout", 0), ("stderr", 12345), ("relay", 1 << 40)])
def test_dropped_marker_round_trips(source, count):
    text = "before" + boundary.dropped_marker(source, count) + "after"
    pieces = boundary.split_markers(text)
    assert pieces[0] == "before" and pieces[2] == "after"
    assert pieces[1][0] == "dropped" and boundary.parse_dropped(pieces[1][1]) == (source, count)


def test_split_markers_keeps_order_and_leaves_other_text_alone():
    path = f"{boundary.LOGS}/cell-3.txt"
    text = (
        boundary.spill_marker(path) + "x\n" + boundary.dropped_marker("relay", 7)
        + boundary.spill_full_marker(64 << 20)
    )  # fmt: skip
    assert boundary.split_markers(text) == [
        ("spill", path), "x\n", ("dropped", "relay 7"), ("spill-full", str(64 << 20))
    ]  # fmt: skip
    plain = "no marker here\n\x1b[31mred\x1b[0m [sandcell-dropped stdout 3]"
    assert boundary.split_markers(plain) == [plain]


def test_the_host_collector_reads_what_the_container_writes():
    collector = Collector("code", cap=1000)
    log = f"{boundary.LOGS}/cell-1.txt"
    text = "a" + boundary.dropped_marker("stdout", 99) + boundary.spill_marker(log) + "b"
    collector.add({"msg_type": "stream", "content": {"name": "stdout", "text": text}})
    execution = collector.finish(0.1)
    assert execution.dropped_bytes == execution.cut_chars == 99
    assert execution.stdout == "a" + CUT_NOTE.format(n=99) + "b"
    assert execution.saved_output == log and execution.saved_truncated is None


def test_markers_model_code_prints_neither_crash_the_host_nor_point_anywhere():
    """Model code can print what looks like a marker: bad counts, other streams, paths
    outside the logs folder. The host drops those and keeps the cell's real output."""
    forged = [
        "\n\x1b[sandcell-spill-full oops]\n",
        "\n\x1b[sandcell-dropped stdout abc]\n",
        "\n\x1b[sandcell-dropped evil 5]\n",
        "\n\x1b[sandcell-dropped stdout " + "9" * 5000 + "]\n",
        "\n\x1b[sandcell-spill /etc/shadow]\n",
        f"\n\x1b[sandcell-spill {boundary.LOGS}/../../etc/shadow]\n",
    ]
    collector = Collector("code", cap=1000)
    for text in forged:
        collector.add({"msg_type": "stream", "content": {"name": "stdout", "text": "ok " + text}})
    execution = collector.finish(0.1)
    assert execution.stdout == "ok " * len(forged)
    assert execution.saved_output is None and execution.saved_truncated is None
    assert execution.dropped_bytes == 0


def _build_hash(tree: Path, extra: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "EXTRA"}
    done = subprocess.run(
        ["bash", str(tree / "images" / "build.sh"), "--hash"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=env if extra is None else {**env, "EXTRA": str(extra)},
    )
    return done.stdout.strip()


def _build_tree(tmp_path: Path) -> Path:
    """A copy of the build folder and the contract, so the real files are never touched."""
    shutil.copytree(ROOT / "images", tmp_path / "images", ignore=shutil.ignore_patterns(".wheels"))
    (tmp_path / "sandbox").mkdir()
    shutil.copy(ROOT / "sandbox" / "boundary.py", tmp_path / "sandbox" / "boundary.py")
    return tmp_path


def test_image_build_copies_the_contract_and_hashes_it(tmp_path):
    _build_tree(tmp_path)
    contract = tmp_path / "sandbox" / "boundary.py"
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


def test_extra_requirements_change_the_image_hash(tmp_path):
    tree = _build_tree(tmp_path / "tree")
    plain = _build_hash(tree)
    extra = tmp_path / "extra.txt"
    extra.write_text("tabulate==0.9.0\n")
    with_extra = _build_hash(tree, extra)
    assert with_extra != plain
    assert _build_hash(tree, extra) == with_extra  # the same extra: the same hash
    extra.write_text("tabulate==0.9.0\nrich==13.7.1\n")
    assert _build_hash(tree, extra) not in (plain, with_extra)
    assert _build_hash(tree) == plain
    missing = subprocess.run(
        ["bash", str(tree / "images" / "build.sh"), "--hash"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "EXTRA": str(tmp_path / "no.txt")},
    )  # fmt: skip
    assert missing.returncode != 0 and "no.txt" in missing.stderr


def test_the_offline_note_names_packages_the_image_really_has():
    from sandbox.render import MAIN_PACKAGES

    wanted = (ROOT / "images" / "requirements.in").read_text().split()
    assert MAIN_PACKAGES and set(MAIN_PACKAGES) <= set(wanted)


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


def _tar(files: dict[str, bytes], mode: str = "w") -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_export_takes_only_a_plain_tar_within_its_cap(tmp_path):
    """What comes back from the container is hostile (model code can write into the file
    helper's output): a compressed archive is not unpacked (a small bz2 could fill the host's
    disk), files over the cap and garbage are a SandboxError, a plain tar is unpacked."""
    from sandbox.container import extract_tar
    from sandbox.errors import SandboxError

    plain = _tar({"a.txt": b"hello"})
    assert extract_tar(plain, tmp_path / "ok", cap=100) == ["a.txt"]
    assert (tmp_path / "ok" / "a.txt").read_bytes() == b"hello"
    bomb = _tar({"bomb.bin": b"\0" * (1 << 20)}, mode="w:bz2")
    assert len(bomb) < 2000
    with pytest.raises(SandboxError):
        extract_tar(bomb, tmp_path / "bomb", cap=1 << 30)
    assert not (tmp_path / "bomb" / "bomb.bin").exists()
    with pytest.raises(SandboxError, match="over 100"):
        extract_tar(_tar({"big.bin": b"x" * 101}), tmp_path / "big", cap=100)
    with pytest.raises(SandboxError):
        extract_tar(b"not a tar at all" * 100, tmp_path / "junk", cap=100)
