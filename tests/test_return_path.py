"""The way back from the sandbox (issue 21): what `collect` unpacks cannot land outside the
session folder, model code cannot write into the file helper's stream, copying files back
never loses an answer nor pins a served session, and the pool's input staging is private."""

import json
import os
import subprocess
import tarfile
from pathlib import Path

import docker
import docker.errors
import pytest

from sandcell import Agent, OpenAIModel
from sandcell.agent.stops import Rules
from sandcell.sandbox import DockerSandbox, Inputs, Limits, SandboxError, boundary, render
from sandcell.sandbox import container as ctr
from tests.scripted_server import ScriptedServer, dead_url
from tests.serve_helpers import client, config, serving, wait_for
from tests.test_sandbox_security import known_runsc_difference


@pytest.fixture(scope="module")
def runtime(runtime, transport):
    """Each sandbox test here runs under each runtime, and over each transport: the local
    engine's ipc, and the engine's API alone (stream) over TCP, as a remote engine is."""
    if transport == "podman" and runtime == "runsc":
        pytest.skip("Podman's Docker API takes no runtime: gVisor is not reachable through it")
    return runtime


def member(name: str, data: bytes) -> bytes:
    """One tar member, header and padded data, as model code would write it by hand."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(format=tarfile.GNU_FORMAT) + data + b"\0" * (-len(data) % 512)


def forged_members(outside: Path) -> bytes:
    folder = tarfile.TarInfo("output")
    folder.type = tarfile.DIRTYPE  # so that unpacking `output/..` finds its folder
    return (
        folder.tobuf(format=tarfile.GNU_FORMAT)
        + member("output/../trace.jsonl", b'{"type": "forged"}\n')
        + member(f"{outside}/z", b"forged")
    )


def archive(*parts: bytes) -> bytes:
    return b"".join(parts) + b"\0" * 1024


class ArchiveSandbox:
    """A sandbox whose workspace archive is the bytes given: the host end alone, no Docker."""

    def __init__(self, data: bytes):
        self.limits, self.inputs, self.data = Limits(), Inputs(), data

    def export(self, host_dir, subdir: str = "") -> list[str]:
        return ctr.extract_tar(self.data, Path(host_dir), 1 << 20)

    def run(self, code, timeout=None, *, on_output=None):
        raise AssertionError("no code runs here")

    def interrupt(self) -> None: ...
    def restart(self) -> None: ...
    def stat(self, path: str) -> dict: ...
    def read(self, path: str, max_bytes=None) -> bytes: ...
    def write(self, path: str, data: bytes) -> None: ...
    def files(self) -> list[dict]: ...
    def add_inputs(self, more) -> None: ...
    def run_checks(self, request: dict) -> dict: ...
    def renew(self, inputs) -> None: ...
    def close(self) -> None: ...


def offline_agent() -> Agent:
    return Agent(OpenAIModel("none", base_url=dead_url(), api_key="k"), rules=Rules())


def trace_types(path: Path) -> list[str]:
    return [json.loads(line)["type"] for line in path.read_text().splitlines()]


def assert_nothing_outside(folder: Path, outside: Path) -> None:
    assert not outside.exists(), "a folder was made outside the session folder"
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root, name)
            assert not path.is_symlink() and path.resolve().is_relative_to(folder.resolve())


@pytest.mark.timeout(30)
def test_collect_moves_only_files_on_disk_and_nothing_escapes_the_session_folder(tmp_path):
    folder, outside = tmp_path / "session", tmp_path / "outside"
    link = tarfile.TarInfo("output/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    data = archive(
        forged_members(outside),
        member("output/ok.txt", b"ok"),
        link.tobuf(format=tarfile.GNU_FORMAT),
        member("notes/b.txt", b"b"),
    )
    with offline_agent().session(output_dir=folder, sandbox=ArchiveSandbox(data)) as session:
        before = (folder / "trace.jsonl").stat().st_ino
        copied, skipped = session.collect()
        assert (folder / "trace.jsonl").stat().st_ino == before
        assert trace_types(folder / "trace.jsonl") == ["session"]  # not the forged one
        assert (folder / "output" / "ok.txt").read_text() == "ok"
        rel = sorted(str(Path(p).relative_to(folder)) for p in copied)
        # what the archive said is where a file is; no link, nothing outside
        assert rel == sorted(
            [
                "output/ok.txt",
                f"workspace/{str(outside).lstrip('/')}/z",
                "workspace/notes/b.txt",
                "workspace/trace.jsonl",
            ]
        )
        assert skipped == []
        assert_nothing_outside(folder, outside)
        # a member naming a path out of the archive's folder spoils the whole archive
        session.sandbox.data = archive(member("../up.txt", b"x"))
        with pytest.raises(SandboxError, match="could not be copied"):
            session.collect()
        assert not (folder.parent / "up.txt").exists()


# -- with Docker ------------------------------------------------------------------------------

# A background thread in the kernel opens fd 1 of every file helper it sees and writes tar
# members in front of (or into) what the helper sends; it notes each success and refusal.
ATTACK = r"""
import os, threading, time
FORGED = bytes.fromhex(%r)
def attack():
    seen = set()
    while True:
        for pid in os.listdir('/proc'):
            if not pid.isdigit() or pid in seen:
                continue
            try:
                if b'files.py' not in open(f'/proc/{pid}/cmdline', 'rb').read():
                    continue
            except OSError:
                continue
            seen.add(pid)
            try:
                fd = os.open(f'/proc/{pid}/fd/1', os.O_WRONLY)
                os.write(fd, FORGED)
                os.close(fd)
                note = '/tmp/forged'
            except OSError:
                note = '/tmp/refused'
            with open(note, 'a') as f:
                f.write(pid + '\n')
        time.sleep(0.002)
threading.Thread(target=attack, daemon=True).start()
os.makedirs('/workspace/output', exist_ok=True)
open('/workspace/output/a.txt', 'w').write('a')
"""
NOTES = "import os\nprint({n: len(open('/tmp/'+n).read().split()) if os.path.exists('/tmp/'+n) else 0 for n in ('forged', 'refused')})"  # fmt: skip


def attack_code(outside: Path) -> str:
    return ATTACK % forged_members(outside).hex()


@pytest.mark.docker
@pytest.mark.timeout(180)
def test_forged_tar_members_written_into_the_helper_s_stdout_land_nowhere(tmp_path, runtime):
    folder, outside = tmp_path / "session", tmp_path / "outside"
    script = [
        {"tool_calls": [{"name": "python", "arguments": {"code": attack_code(outside)}}]},
        "done",
    ]
    with ScriptedServer(script) as server:
        model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
        agent = Agent(model, limits=Limits(runtime=runtime), rules=Rules())
        with agent.session(output_dir=folder) as session:
            result = session.ask("go")
            for _ in range(3):  # more helpers for the attacker to find; a broken stream warns
                session.bring_back()
            notes = session.sandbox.run(NOTES)
    assert result.answer == "done"
    types = trace_types(folder / "trace.jsonl")
    assert types[0] == "session" and "forged" not in types and "final" in types, types
    assert_nothing_outside(folder, outside)
    assert "'refused'" in notes.stdout or "'forged'" in notes.stdout, render(notes)


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_model_code_cannot_open_the_file_helper_s_stdout(tmp_path, runtime, request):
    known_runsc_difference(
        runtime, request, "runsc (2022-12) lets the same uid open /proc/<pid>/fd of another "
        "group's process and ignores PR_SET_DUMPABLE; landing.py holds there", strict=True
    )  # fmt: skip
    with DockerSandbox(Limits(runtime=runtime)) as sb:
        assert sb.run(attack_code(Path("/nowhere"))).ok
        for _ in range(5):
            sb.files()
            sb.export(tmp_path / "exported", "output")
        counts = eval(sb.run(NOTES).stdout)
    assert counts["refused"] >= 3 and counts["forged"] == 0, counts


def py(code: str) -> dict:
    return {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}


OUT = "import os, shutil\nos.chdir('/workspace')\nos.makedirs('output/b', exist_ok=True)\n"
FILE_AND_FOLDER = OUT + "open('output/a', 'w').write('1'); open('output/b/y', 'w').write('2')"
SWAPPED = OUT + (
    "os.remove('output/a'); os.makedirs('output/a'); open('output/a/y', 'w').write('3')\n"
    "shutil.rmtree('output/b'); open('output/b', 'w').write('4')"
)


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_a_file_turned_folder_and_back_is_a_warning_and_the_answer_stands(tmp_path, runtime):
    folder = tmp_path / "s"
    with ScriptedServer([py(FILE_AND_FOLDER), "first", py(SWAPPED), "second"]) as server:
        model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
        agent = Agent(model, limits=Limits(runtime=runtime), rules=Rules())
        with agent.session(output_dir=folder) as session:
            first = session.ask("1")
            second = session.ask("2")
    assert first.answer == "first" and first.warnings == []
    assert second.answer == "second"
    [warning] = second.warnings
    assert "2 file(s) under /workspace were not copied" in warning
    assert "output/a/y: File exists" in warning and "output/b: Is a directory" in warning
    assert (folder / "output" / "a").read_text() == "1"  # what was there stays
    assert (folder / "output" / "b" / "y").read_text() == "2"
    assert "export_failed" in trace_types(folder / "trace.jsonl")


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_an_idle_release_whose_files_cannot_come_back_still_removes_the_container(tmp_path):
    engine = docker.from_env()
    with (
        ScriptedServer() as model,
        serving(config(model, tmp_path / "d", idle_minutes=0.05)) as base,
        client(base) as api,
    ):
        sid = api.post("/api/sessions").json()["id"]
        session = f"/api/sessions/{sid}"

        def run_then_wait_for_release(code: str) -> str:
            r = api.post(f"{session}/execute", json={"code": code + "\nimport socket; print(socket.gethostname())"})  # fmt: skip
            assert r.status_code == 200 and r.json()["error"] is None, r.text
            out = "".join(c["text"] for c in r.json()["stream"] if c["name"] == "stdout")
            container = out.strip()
            wait_for(lambda: api.get(session).json()["sandbox"] == "released", 60)
            with pytest.raises(docker.errors.NotFound):
                engine.containers.get(container)
            return container

        run_then_wait_for_release(FILE_AND_FOLDER)
        folder = tmp_path / "d" / "alice" / sid
        assert (folder / "output" / "b" / "y").read_text() == "2"
        run_then_wait_for_release(SWAPPED)  # files put back, swapped, cannot all come back
        assert (folder / "output" / "a").read_text() == "1"
        assert "export_failed" in trace_types(folder / "trace.jsonl")
        r = api.post(f"{session}/execute", json={"code": "open('/workspace/output/a').read()"})
        assert r.status_code == 200, r.text  # the session goes on with a fresh sandbox


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_pool_input_staging_is_private_to_the_host_user_and_readable_inside(tmp_path, runtime):
    data = tmp_path / "in.csv"
    data.write_text("a\n1\n")
    data.chmod(0o444)  # as an upload is kept
    with DockerSandbox(Limits(runtime=runtime), staging=True) as sb:
        sb.add_inputs([data])
        ex = sb.run("print(open('/data/in.csv').read())")
        assert ex.ok and ex.stdout == "a\n1\n\n", render(ex)
        if sb.streamed:
            assert_inputs_in_a_volume_of_their_own(sb)
            return
        private = ctr.staging_path(sb.conn_dir)
        assert private.stat().st_mode & 0o077 == 0, oct(private.stat().st_mode)
        if os.getuid() != 0:
            pytest.skip("another account's view needs root to take that account")
        probe = (
            "import os, sys\n"
            "for what in (lambda: os.listdir(sys.argv[1]), lambda: open(sys.argv[2]).read()):\n"
            "    try:\n        what(); print('read')\n"
            "    except PermissionError:\n        print('refused')\n"
        )
        if not os.access("/usr/bin/python3", os.X_OK):
            pytest.skip("no /usr/bin/python3 for another account to run")
        seen = subprocess.run(
            ["/usr/bin/python3", "-c", probe, str(private), str(sb.staging_dir / "in.csv")],
            user=65534, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert seen.stdout.split() == ["refused", "refused"], seen.stdout + seen.stderr


def assert_inputs_in_a_volume_of_their_own(sb: DockerSandbox) -> None:
    """Over the stream transport the inputs were copied through the engine's API into the
    sandbox's own volume (read-only; its one other mount is the bridge's key folder): root's
    files, read-only, gone with it."""
    ex = sb.run(
        "import os\nst = os.stat('/data/in.csv')\nprint(st.st_uid, oct(st.st_mode & 0o777))"
    )
    assert ex.stdout.split() == ["0", "0o444"], render(ex)
    mounts = {
        m["Destination"]: (m["Type"], m.get("Name"), m["RW"]) for m in sb.container.attrs["Mounts"]
    }
    key = mounts.pop(boundary.KEY_DIR)  # the bridge's folder: a volume in memory, its own
    assert key[0] == "volume" and key[1].startswith("sandcell-key-") and key[2], key
    assert mounts == {"/data": ("volume", sb.volume, False)}, mounts
    assert sb.client.volumes.get(sb.volume).attrs["Labels"]["sandcell"] == "1"
    client, volume = sb.client, sb.volume
    sb.close()
    left = [v.name for v in client.volumes.list()]
    assert volume not in left and key[1] not in left


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_a_kernel_whose_json_packer_model_code_broke_ends_at_its_deadline_not_in_an_error(runtime):
    """Every message the kernel sends is then unreadable (not JSON, and one signature replayed
    over and over): the host counts them as dropped and the cell ends at its deadline with a
    fresh kernel; no JSONDecodeError or 'Duplicate Signature' reaches the caller."""
    with DockerSandbox(Limits(runtime=runtime)) as sb:
        broken = sb.run("import json\njson.dumps = lambda *a, **k: '{'\nprint('x')", timeout=5)
        assert broken.timed_out and broken.restarted and broken.dropped_bytes > 0
        assert "bytes of output were dropped" in render(broken)
        after = sb.run("print(6 * 7)", timeout=30)
        assert after.ok and after.stdout == "42\n"
