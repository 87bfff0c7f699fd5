"""The package path a new user takes: the sdist and the wheel built as a packager builds them
(python -m build: the wheel is made from the sdist), the wheel installed into a fresh venv
outside the repository, and from there `sandcell --version`, `sandcell image build` (a tag of
its own, so the build really runs, on the engine's cached layers), `sandcell doctor` and
`sandcell exec`. Nothing of the clone is on that venv's path. Then the one import name: no
bare `agent`, `sandbox` or `tools` installed, the user's own packages of those names untouched,
a type checker that sees real types; and the editable install a clone uses (strict mode)."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import docker
import docker.errors
import pytest

from sandcell.sandbox import image_build
from tests.wheels import make_wheel

ROOT = Path(__file__).resolve().parent.parent
# where the wheel installs images/ (package-dir: sandcell.images), and where the sdist keeps it
IMAGE_FILES = [f"sandcell/images/{name}" for name in image_build.SOURCES] + [
    "sandcell/sandbox/boundary.py"
]
SDIST_FILES = [f"images/{name}" for name in image_build.SOURCES] + ["sandbox/boundary.py"]


# One worker builds once for every test here, from a copy: a build writes into its source tree.
# The tests share one venv and run in this order (the last ones add packages to it).
pytestmark = [pytest.mark.wheel, pytest.mark.xdist_group("install")]
PROJECT = ["pyproject.toml", "README.md", "LICENSE", "src", "agent", "sandbox", "tools", "images"]
IGNORED = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
FRONT_DOOR = (
    "Agent, Session, RunResult, DockerSandbox, SandboxPool, Limits, Inputs, Execution, Result, "
    "ExecutionError"
)


def _copy_project(tree: Path) -> Path:
    """The files a packager gets, copied: building or linking writes into the source tree."""
    tree.mkdir(parents=True, exist_ok=True)
    for name in PROJECT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=IGNORED)
        else:
            shutil.copy(source, tree / name)
    return tree


def _clean_env(venv: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("OPENAI_")
    }
    return {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}"}


def _python(venv: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True, text=True, env=_clean_env(venv), cwd=cwd, timeout=120,
    )  # fmt: skip


def _pip(venv: Path, *args: str, timeout: float = 600) -> None:
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         *args],
        check=True, capture_output=True, timeout=timeout,
    )  # fmt: skip


def _mypy(venv: Path, script: Path) -> str:
    """This suite's pinned mypy, reading the packages installed in `venv`, as a user's editor
    or CI would check a script that uses sandcell."""
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(venv / "bin" / "python"),
         "--no-incremental", "--strict", str(script)],
        capture_output=True, text=True, cwd=script.parent, timeout=300,
    )  # fmt: skip
    return checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    tree, out = _copy_project(tmp_path_factory.mktemp("tree")), tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "-q", "--outdir", str(out), str(tree)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed, outside the clone."""
    (wheel,) = dist.glob("sandcell-*.whl")
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    _pip(venv, "-c", str(ROOT / "constraints.txt"), str(wheel))
    return venv


@pytest.mark.timeout(360)
def test_the_wheel_and_the_sdist_hold_every_file_the_image_build_needs(dist):
    """Read from the Dockerfile's COPY lines too: a program added there but not packaged fails
    here, not in a user's build."""
    (wheel,) = dist.glob("sandcell-*.whl")
    (sdist,) = dist.glob("sandcell-*.tar.gz")
    with zipfile.ZipFile(wheel) as zipped, tarfile.open(sdist) as tarred:
        in_wheel = set(zipped.namelist())
        metadata = zipped.read(next(n for n in in_wheel if n.endswith(".dist-info/METADATA")))
        top_level = zipped.read(next(n for n in in_wheel if n.endswith(".dist-info/top_level.txt")))
        record = zipped.read(next(n for n in in_wheel if n.endswith(".dist-info/RECORD")))
        top = sdist.name.removesuffix(".tar.gz")
        in_sdist = {n.removeprefix(top + "/") for n in tarred.getnames()}
    dockerfile = (ROOT / "images" / "Dockerfile").read_text()
    copied = {
        word
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for word in line.split()[1:-1]
        if not word.startswith(".")  # .wheels: downloaded at build time
    }
    assert copied >= {"boundary.py", "supervisor.py", "relay.py", "files.py"}
    programs = copied - {"boundary.py"}
    common = {"sandbox/image_build.py", "agent/serve/static/page.js"}
    wanted = set(IMAGE_FILES) | {f"sandcell/images/{n}" for n in programs}
    wanted |= {f"sandcell/{n}" for n in common} | {"sandcell/__init__.py", "sandcell/py.typed"}
    assert wanted <= in_wheel, wanted - in_wheel
    # one import name: every file of the wheel is under sandcell/ or its metadata
    assert top_level.decode().split() == ["sandcell"]
    recorded = {line.split(",")[0].split("/")[0] for line in record.decode().splitlines()}
    assert {name for name in recorded if not name.endswith(".dist-info")} == {"sandcell"}
    assert {name.split("/")[0] for name in in_wheel if ".dist-info/" not in name} == {"sandcell"}
    wanted = set(SDIST_FILES) | {f"images/{n}" for n in programs} | common
    wanted |= {"src/sandcell/__init__.py", "src/sandcell/py.typed"}
    assert wanted <= in_sdist, wanted - in_sdist
    metadata = metadata.decode()
    assert "License-Expression: MIT" in metadata and "Classifier: " in metadata
    assert "Provides-Extra: ray" in metadata


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_fresh_venv_from_the_wheel_builds_the_image_and_runs_code(venv, tmp_path):
    tag = f"sandcell-sandbox:wheel-{os.getpid()}"
    env = {**_clean_env(venv), "SANDCELL_IMAGE": tag}
    home = tmp_path / "home"  # a new user: cwd outside the clone

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        home.mkdir(exist_ok=True)
        return subprocess.run(
            [str(venv / "bin" / "sandcell"), *args],
            capture_output=True, text=True, env=env, cwd=home, timeout=timeout,
        )  # fmt: skip

    where = _python(venv, "import sandcell; print(sandcell.__file__)", tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
    version = run("--version")
    assert version.returncode == 0 and image_build.sources_hash() in version.stdout
    try:
        built = run("image", "build", timeout=600)
        assert built.returncode == 0, built.stdout + built.stderr
        assert f"built {tag}" in built.stdout and re.search(r"step \d+/\d+: ", built.stderr)
        again = run("image", "build")
        assert again.returncode == 0 and "is up to date" in again.stdout
        doctor = run("doctor", timeout=60)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        executed = run("exec", "-c", "print(6 * 7)", timeout=180)
        assert executed.returncode == 0 and executed.stdout.strip() == "42", executed.stderr
    finally:  # the tag only: its layers are the suite's image's
        try:
            docker.from_env().images.remove(tag, noprune=True)
        except docker.errors.ImageNotFound:
            pass


@pytest.mark.timeout(360)
def test_the_wheel_installs_one_import_name_with_real_types(venv, tmp_path):
    """No bare `agent`, `sandbox` or `tools` (PyPI has packages of those names); the front
    door's names are plain imports that load no model client; a type checker sees them."""
    for bare in ("agent", "sandbox", "tools", "images"):
        tried = _python(venv, f"import {bare}", tmp_path)
        assert f"ModuleNotFoundError: No module named '{bare}'" in tried.stderr, tried.stderr
    front = _python(
        venv,
        f"import sys\nfrom sandcell import {FRONT_DOOR}\nimport sandcell\n"
        "print(sandcell.__version__, 'openai' in sys.modules, sandcell.OpenAIModel.__name__)",
        tmp_path,
    )
    version = front.stdout.split()[0] if front.stdout else ""
    assert front.stdout.split()[1:] == ["False", "OpenAIModel"], front.stdout + front.stderr
    assert version == image_build.sandcell_version()  # the metadata's: written once
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent("""\
        import sandcell
        from sandcell import Agent, DockerSandbox, Session

        reveal_type(sandcell.Agent)
        reveal_type(DockerSandbox().run)
        reveal_type(sandcell.OpenAIModel)


        def ask(session: Session) -> str | None:
            reveal_type(session.ask("Which region sold most?"))
            return session.ask("Which region sold most?").answer


        def wrong(agent: Agent) -> int:
            return agent.session().ask(42).answer
        """)
    )
    said = _mypy(venv, script)
    revealed = [line for line in said.splitlines() if "Revealed type is" in line]
    assert len(revealed) == 4 and not any('"Any"' in line for line in revealed), said
    assert "def (model: sandcell.agent.seams.Model, *, limits: " in revealed[0], said
    assert "-> sandcell.sandbox.execution.Execution" in revealed[1], said
    assert "sandcell.agent.model.openai_model.OpenAIModel" in revealed[2], said
    assert revealed[3].endswith('"sandcell.agent.seams.RunResult"'), said
    # the checker sees the calls too: a wrong argument and a wrong return type are errors
    assert re.search(r"user_script.py:\d+: error: .*\[arg-type\]", said), said
    assert re.search(r"user_script.py:\d+: error: .*\[return-value\]", said), said


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_beside_a_projects_own_agent_and_tools(venv, tmp_path):
    """Installed into a venv that already has a package named `tools` (and one named `agent`),
    both stay importable and sandcell still runs; from a project folder holding its own
    `agent/` and `tools/` packages, the user's code gets theirs and sandcell's code its own."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("tools", "agent"):
        _pip(venv, "--no-deps", str(make_wheel(wheels, name, code="WHO = 'pypi'\n")), timeout=120)
    project = tmp_path / "project"
    for name in ("agent", "tools"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text("WHO = 'project'\n")
    elsewhere = _python(venv, "import agent, tools; print(agent.WHO, tools.WHO)", tmp_path)
    assert elsewhere.stdout.split() == ["pypi", "pypi"], elsewhere.stderr
    mixed = _python(
        venv,
        "import agent, tools\nfrom sandcell import Agent, DockerSandbox\n"
        "from sandcell.tools import Registry\nprint(agent.WHO, tools.WHO, Registry.__module__)",
        project,
    )
    assert mixed.stdout.split() == ["project", "project", "sandcell.tools.registry"], mixed.stderr
    env = _clean_env(venv)
    assert (
        subprocess.run(
            [str(venv / "bin" / "sandcell"), "--version"], capture_output=True, env=env, cwd=project
        ).returncode
        == 0
    )
    for command in ([str(venv / "bin" / "sandcell")], [str(venv / "bin" / "python"), "-m",
                                                        "sandcell.agent.cli"]):  # fmt: skip
        ran = subprocess.run(
            [*command, "exec", "-c", "print(1)"],
            capture_output=True, text=True, env=env, cwd=project, timeout=180,
        )  # fmt: skip
        assert ran.returncode == 0 and ran.stdout.strip() == "1", ran.stdout + ran.stderr


@pytest.mark.timeout(600)
def test_an_editable_install_in_strict_mode_is_the_same_package(venv, dist, tmp_path):
    """What `make install` does in a clone: `pip install -e` in setuptools' strict mode, a tree
    of links a type checker can follow, each folder under its one import name."""
    tree = _copy_project(tmp_path / "clone")
    _pip(venv, "--no-deps", "--config-settings", "editable_mode=strict", "-e", str(tree))
    where = _python(
        venv,
        "import os, sandcell, sandcell.agent.loop, sandcell.sandbox.boundary\n"
        "from sandcell.sandbox.image_build import SOURCES_DIR\n"
        "print(os.path.realpath(sandcell.__file__))\n"
        "print(os.path.realpath(sandcell.agent.loop.__file__))\n"
        "print(os.path.realpath(SOURCES_DIR / 'Dockerfile'))",
        tmp_path,
    )
    assert where.stdout.split() == [
        str(tree / "src" / "sandcell" / "__init__.py"),
        str(tree / "agent" / "loop.py"),
        str(tree / "images" / "Dockerfile"),
    ], where.stdout + where.stderr
    script = tmp_path / "typed.py"
    script.write_text("from sandcell import Agent\nreveal_type(Agent.session)\n")
    said = _mypy(venv, script)
    assert 'Revealed type is "def (self: sandcell.agent.session.Agent' in said, said
