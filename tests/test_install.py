"""The package path a new user takes: the sdist and the wheel built as a packager builds them
(python -m build: the wheel is made from the sdist), the wheel installed into a fresh venv
outside the repository, and from there `sandcell --version`, `sandcell image build` (a tag of
its own, so the build really runs, on the engine's cached layers), `sandcell doctor` and
`sandcell exec`. Nothing of the clone is on that venv's path."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import docker
import docker.errors
import pytest

from sandcell.sandbox import image_build

ROOT = Path(__file__).resolve().parent.parent
# where the wheel installs images/ (package-dir: sandbox.image), and where the sdist keeps it
IMAGE_FILES = [f"sandbox/image/{name}" for name in image_build.SOURCES] + ["sandbox/boundary.py"]
SDIST_FILES = [f"images/{name}" for name in image_build.SOURCES] + ["sandbox/boundary.py"]


# One worker builds once for both tests, from a copy: a build writes into its source tree.
pytestmark = pytest.mark.xdist_group("install")
PROJECT = ["pyproject.toml", "README.md", "LICENSE", "agent", "sandbox", "tools", "images"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("dist")
    for name in PROJECT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tree / name)
    subprocess.run(
        [sys.executable, "-m", "build", "-q", "--outdir", str(out), str(tree)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


@pytest.mark.timeout(360)
def test_the_wheel_and_the_sdist_hold_every_file_the_image_build_needs(dist):
    """Read from the Dockerfile's COPY lines too: a program added there but not packaged fails
    here, not in a user's build."""
    (wheel,) = dist.glob("sandcell-*.whl")
    (sdist,) = dist.glob("sandcell-*.tar.gz")
    with zipfile.ZipFile(wheel) as zipped, tarfile.open(sdist) as tarred:
        in_wheel = set(zipped.namelist())
        metadata = zipped.read(next(n for n in in_wheel if n.endswith(".dist-info/METADATA")))
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
    wanted = set(IMAGE_FILES) | {f"sandbox/image/{n}" for n in programs} | common
    assert wanted <= in_wheel, wanted - in_wheel
    assert not any(n.startswith("images/") for n in in_wheel)  # no top-level `images` package
    wanted = set(SDIST_FILES) | {f"images/{n}" for n in programs} | common
    assert wanted <= in_sdist, wanted - in_sdist
    metadata = metadata.decode()
    assert "License-Expression: MIT" in metadata and "Classifier: " in metadata
    assert "Provides-Extra: ray" in metadata


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_fresh_venv_from_the_wheel_builds_the_image_and_runs_code(dist, tmp_path):
    (wheel,) = dist.glob("sandcell-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run(
        [*pip, "-c", str(ROOT / "constraints.txt"), str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    tag = f"sandcell-sandbox:wheel-{os.getpid()}"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("OPENAI_")
    }
    env = {**env, "SANDCELL_IMAGE": tag, "PATH": f"{venv / 'bin'}:{env['PATH']}"}
    home = tmp_path / "home"  # a new user: cwd outside the clone

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        home.mkdir(exist_ok=True)
        return subprocess.run(
            [str(venv / "bin" / "sandcell"), *args],
            capture_output=True, text=True, env=env, cwd=home, timeout=timeout,
        )  # fmt: skip

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sandbox; print(sandbox.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(venv)), where
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
