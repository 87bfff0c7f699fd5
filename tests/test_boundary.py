"""The host-container contract (sandbox/boundary.py): its markers round-trip, the image build
ships it (its hash changes when the contract does), and the image really carries this copy."""

import shutil
import subprocess
from pathlib import Path

import pytest

from sandcell.sandbox import boundary
from sandcell.sandbox.execution import CUT_NOTE
from sandcell.sandbox.kernel import Collector

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


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """A copy of the image's sources and the contract, so the real files are never touched."""
    from sandcell.sandbox import image_build

    folder = tmp_path / "images"
    shutil.copytree(image_build.SOURCES_DIR, folder)
    contract = shutil.copy(image_build.CONTRACT, tmp_path / "boundary.py")
    monkeypatch.setattr(image_build, "SOURCES_DIR", folder)
    monkeypatch.setattr(image_build, "CONTRACT", Path(contract))
    return tmp_path


def test_the_image_hash_covers_the_contract_and_every_source(sources):
    from sandcell.sandbox import image_build

    before = image_build.sources_hash()
    assert image_build.sources_hash() == before  # nothing changed: the same hash
    for path in [sources / "boundary.py", *(sources / "images" / n for n in image_build.SOURCES)]:
        kept = path.read_bytes()
        path.write_bytes(kept + b"\n# changed\n")
        assert image_build.sources_hash() != before, path
        path.write_bytes(kept)
    assert image_build.sources_hash() == before


def test_base_and_extra_requirements_change_the_build_hash():
    from sandcell.sandbox.image_build import DEFAULT_BASE, image_hash

    plain = image_hash()
    assert image_hash(DEFAULT_BASE, None) == plain
    assert image_hash("python:3.11-slim") != plain
    with_extra = image_hash(DEFAULT_BASE, b"tabulate==0.9.0\n")
    assert with_extra != plain and image_hash(DEFAULT_BASE, b"tabulate==0.9.0\n") == with_extra
    assert image_hash(DEFAULT_BASE, b"tabulate==0.9.0\nrich==13.7.1\n") not in (plain, with_extra)


def test_the_build_context_holds_every_file_the_dockerfile_copies(tmp_path):
    """Read from the Dockerfile, not from the builder's own list: a program added to the
    image but left out of the context fails here, not in a user's build."""
    import tarfile

    from sandcell.sandbox import image_build

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "requirements.txt").write_text("x==1\n")
    (wheels / "x-1-py3-none-any.whl").write_bytes(b"wheel")
    context = tmp_path / "context.tar"
    with open(context, "w+b") as out:
        image_build.context_tar(wheels, None, out)
    with tarfile.open(context) as tar:
        names = set(tar.getnames())
        contract = tar.extractfile("boundary.py").read()
    dockerfile = (image_build.SOURCES_DIR / "Dockerfile").read_text().replace("\\\n", " ")
    copied = [
        line.split()[1:-1]
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    wanted = {source for sources in copied for source in sources}
    assert "boundary.py" in wanted and "files.py" in wanted
    for source in wanted:
        assert source in names or any(n.startswith(source + "/") for n in names), source
    assert {".wheels/x-1-py3-none-any.whl", ".wheels/extra/requirements.txt"} <= names
    assert contract == image_build.CONTRACT.read_bytes()


def test_the_offline_note_names_packages_the_image_really_has():
    from sandcell.sandbox.render import MAIN_PACKAGES

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
        "the image is older than sandbox/boundary.py: run `sandcell image build`"
    )


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_the_image_under_test_is_current_for_these_sources(image):
    from sandcell.sandbox import image_build
    from sandcell.sandbox.container import engine

    state = image_build.inspect(engine(), image)
    assert state.current, state.describe()


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
    from sandcell.sandbox.container import extract_tar
    from sandcell.sandbox.errors import SandboxError

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


def test_an_editable_install_builds_from_the_clone_s_images_folder():
    """`make install` installs sandcell in place (pip install -e, strict mode: a tree of links):
    the image's sources are the clone's images/, read as the package data sandcell.images (the
    wheel: tests/test_install.py)."""
    from sandcell.sandbox import image_build

    for name, path in image_build._source_paths():
        folder = "sandbox" if name == "boundary.py" else "images"
        assert path.resolve() == (ROOT / folder / name).resolve(), name
    assert not (ROOT / "sandbox" / "image").exists()


# -- the stream transport's framing ------------------------------------------------------------
def test_stream_messages_come_back_whole_however_the_bytes_are_cut():
    sent = [
        (2, [b"<IDS|MSG>", b"sig", b"{}" * 1000]),
        (1, [b""]),
        (boundary.CONTROL, [b"x" * 70_000]),
    ]
    data = b"".join(boundary.encode_message(channel, frames) for channel, frames in sent)
    for piece in (1, 7, 4096, len(data)):
        reader = boundary.MessageReader(1 << 20)
        got = []
        for at in range(0, len(data), piece):
            got += reader.feed(data[at : at + piece])
        assert got == sent
        assert reader.buffer == b""


@pytest.mark.parametrize(
    "data, said",
    [
        (boundary.STREAM_HEADER.pack(9, 1, 8), "unknown channel 9"),
        (boundary.STREAM_HEADER.pack(2, 65, 0), "65 frames"),
        (boundary.STREAM_HEADER.pack(2, 0, 0), "0 frames"),
        (boundary.STREAM_HEADER.pack(2, 1, (1 << 20) + 1), "over the caps"),
        # a frame's length past its message, and a body its frames do not fill
        (
            boundary.STREAM_HEADER.pack(2, 1, 8) + boundary.STREAM_FRAME.pack(5) + b"abcd",
            "runs past",
        ),
        (
            boundary.STREAM_HEADER.pack(2, 1, 6) + boundary.STREAM_FRAME.pack(1) + b"ab",
            "do not fill",
        ),
        (boundary.STREAM_HEADER.pack(2, 2, 5) + boundary.STREAM_FRAME.pack(1) + b"a", "runs past"),
    ],
)
def test_a_stream_that_is_not_messages_is_refused_as_soon_as_it_shows(data, said):
    """What the bridge sends is untrusted bytes: an unknown channel, too many frames, a body
    over the cap (refused from its header alone, before it is buffered) or frames that do not
    fill their body exactly end the reading."""
    with pytest.raises(ValueError, match=said):
        boundary.MessageReader(1 << 20).feed(data)
