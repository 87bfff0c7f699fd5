"""The sandbox image: its sources (images/ in a clone, installed as the package data
sandcell.images), their hash, and the offline build `sandcell image build` runs.

No registry and no network inside the build: the base comes from debootstrap (made once,
kept as an image) or from `--base`, and the Python wheels are downloaded on the host into a
cache and installed in the build with --no-index. The build context is a tar made here from
the package's own files, so an installed wheel builds the same image a clone does."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path

import docker
import docker.errors
import requests

from sandcell.sandbox.errors import SandboxUnavailable

SOURCES_DIR = Path(str(files("sandcell.images")))  # a wheel's copy, or links to images/ (editable)
CONTRACT = Path(__file__).parent / "boundary.py"  # the host-container contract, copied in
PROGRAMS = (
    "supervisor.py", "sandcell_kernel.py", "sandcell_charts.py", "net_forwarder.py",
    "sandcell_pip.py", "relay.py", "bridge.py", "files.py", "checks.py",
)  # fmt: skip
# Every file of the build context but the wheels, in the order the hash reads them.
SOURCES = ("Dockerfile", "requirements.txt", *PROGRAMS)
DEFAULT_BASE = "sandcell-base:bookworm"
LABEL_HASH = "sandcell.hash"  # sources + base + extra: the build's identity and its tag
LABEL_SOURCES = "sandcell.sources"  # the sources alone: "current for this version" compares it
LABEL_VERSION = "sandcell.version"
LABEL_BASE = "sandcell.base"
LABEL_PYTHON = "sandcell.python"  # X.Y: what a wheelhouse must be made for
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)

Say = Callable[[str], None]  # one line of progress for the person waiting


class BuildError(SandboxUnavailable):
    """The image could not be built; the message says what to do."""


def sandcell_version() -> str:
    try:
        return version("sandcell")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


def _source_paths() -> list[tuple[str, Path]]:
    return [(name, SOURCES_DIR / name) for name in SOURCES] + [("boundary.py", CONTRACT)]


def sources_hash() -> str:
    """The hash of what this sandcell puts in its image (the Dockerfile, the pinned
    requirements, the in-image programs and the contract): an image built from other sources
    is not current for this version."""
    digest = hashlib.sha256()
    for name, path in _source_paths():
        data = path.read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def image_hash(base: str = DEFAULT_BASE, extra: bytes | None = None) -> str:
    """The build's identity: the sources, the base and the extra requirements' text. The same
    three give the same hash, and a second build only compares it with the image's label."""
    digest = hashlib.sha256(f"{sources_hash()}\0{base}\0".encode())
    if extra is not None:
        digest.update(extra)
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """Where the downloaded wheels are kept between builds (SANDCELL_CACHE overrides)."""
    if os.environ.get("SANDCELL_CACHE"):
        return Path(os.environ["SANDCELL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sandcell"


@dataclass(frozen=True)
class ImageState:
    """What `sandcell image` and `sandcell doctor` say of the image in use."""

    name: str
    present: bool
    hash: str | None = None
    sources: str | None = None
    version: str | None = None
    base: str | None = None
    size: int = 0
    created: str = ""

    @property
    def current(self) -> bool:
        return self.present and self.sources == sources_hash()

    def describe(self) -> str:
        """One line: what the image is and whether it is current."""
        if not self.present:
            return f"{self.name}: missing; build it with `sandcell image build`"
        made = f"built by sandcell {self.version or '?'}" + (
            f" from {self.base}" if self.base else ""
        )
        size = f"{self.size / 1e9:.2f} GB" if self.size else "size unknown"
        if self.current:
            return f"{self.name}: current (sources {self.sources}, {made}, {size})"
        return (
            f"{self.name}: out of date (its sources {self.sources or 'unknown'}, this sandcell's "
            f"{sources_hash()}; {made}); rebuild with `sandcell image build`"
        )


def inspect(client: docker.DockerClient, name: str) -> ImageState:
    try:
        image = client.images.get(name)
    except docker.errors.ImageNotFound:
        return ImageState(name, present=False)
    labels = image.labels or {}
    return ImageState(
        name,
        present=True,
        hash=labels.get(LABEL_HASH),
        sources=labels.get(LABEL_SOURCES),
        version=labels.get(LABEL_VERSION),
        base=labels.get(LABEL_BASE),
        size=int(image.attrs.get("Size") or 0),
        created=str(image.attrs.get("Created") or "")[:19],
    )


def _pip() -> list[str]:
    """A pip to download with: this Python's, else one on PATH (a `uv tool` venv has none).
    The downloads name the image's platform and Python, so any pip will do."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, timeout=60
    )
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        if found := shutil.which(name):
            return [found]
    raise BuildError(
        "the image build downloads wheels with pip, and none was found: install pip "
        "(`python3 -m ensurepip`, or your system's python3-pip) and build again"
    )


def download_wheels(folder: Path, python: str, *args: str) -> None:
    """pip download for the image's platform and Python into folder; args say what."""
    command = [
        *_pip(),
        "download",
        "-q",
        "--no-color",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        *(f"--platform={p}" for p in WHEEL_PLATFORMS),
        "-d",
        str(folder),
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        # pip says why a resolution failed on stdout ("The conflict is caused by: ...")
        said = [
            line
            for line in (done.stdout + done.stderr).splitlines()
            if line.strip() and "WARNING: Location" not in line
        ]
        raise BuildError(
            "downloading the image's wheels failed (a package index must be reachable for the "
            "first build; later builds use the cache in "
            f"{cache_dir() / 'image-wheels'}):\n" + "\n".join(said[-15:])
        )


def _replace_folder(target: Path, fill: Callable[[Path], None]) -> Path:
    """Fill a fresh folder beside target, then rename it into place: an interrupted download
    never leaves a half folder that looks finished."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(work)
        if target.exists():
            shutil.rmtree(target)
        work.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def wheels_for(python: str, say: Say) -> Path:
    """The pinned closure's wheels for `python`, downloaded once per requirements file."""
    requirements = SOURCES_DIR / "requirements.txt"
    key = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    target = cache_dir() / "image-wheels" / f"{key}-py{python}"
    if (target / "requirements.txt").exists():
        return target

    def fill(work: Path) -> None:
        say(f"downloading the image's wheels for Python {python} (once; kept in {target})")
        download_wheels(work, python, "--no-deps", "-r", str(requirements))
        shutil.copy(requirements, work / "requirements.txt")

    return _replace_folder(target, fill)


def extra_wheels_for(extra: Path, python: str, pinned: Path, say: Say) -> Path:
    """The extra requirements and what they need, held to today's pins, in a folder of their
    own: changing them never downloads the pinned closure again."""
    text = extra.read_bytes()
    key = hashlib.sha256(text + pinned.name.encode()).hexdigest()[:16]
    target = cache_dir() / "image-wheels" / f"extra-{key}"
    if (target / "requirements.txt").exists():
        return target

    def fill(work: Path) -> None:
        say(f"downloading the wheels {extra} needs")
        (work / "requirements.txt").write_bytes(text)
        download_wheels(
            work,
            python,
            "--find-links",
            str(pinned),
            "-r",
            str(work / "requirements.txt"),
            "-c",
            str(SOURCES_DIR / "requirements.txt"),
        )

    return _replace_folder(target, fill)


def make_base(client: docker.DockerClient, base: str, say: Say) -> None:
    """The default base, made with debootstrap from Debian's mirror (root needed, once)."""
    if not shutil.which("debootstrap"):
        if os.getuid() != 0 or not shutil.which("apt-get"):
            raise BuildError(
                "making the base image needs debootstrap (and root): install it "
                "(`sudo apt-get install debootstrap`) and run as root, or build from a "
                "registry's base: `sandcell image build --base python:3.11-slim`"
            )
        say("installing debootstrap")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for step in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "debootstrap"],
        ):
            subprocess.run(step, check=True, capture_output=True, env=env)
    say(f"making the base image {base} with debootstrap (about a minute, once)")
    # not in /tmp: debootstrap refuses a nodev filesystem, which /tmp often is
    cache_dir().mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rootfs.", dir=cache_dir()))
    try:
        done = subprocess.run(
            ["debootstrap", "--variant=minbase",
             "--include=python3,python3-venv,ca-certificates,fonts-dejavu-core",
             "bookworm", str(root)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            raise BuildError(f"debootstrap failed:\n{tail}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (root / cache).glob("*"):
                if item.is_file():
                    item.unlink()
        # the tag inside the repository (the API allows it): Podman 4.3 ignores a separate
        # tag, and named the base `<repository>:latest`, which the build then did not find
        with subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE) as tar:
            client.api.import_image_from_stream(
                tar.stdout, repository=base, changes=['CMD ["/bin/bash"]']
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_once(
    client: docker.DockerClient, image: str, entrypoint: str, args: list[str], **options: object
) -> tuple[int, str]:
    """Run a throwaway container with no network to its end: (exit status, output). It is
    removed whatever happens, a failed start included (docker's run() leaves that one)."""
    from sandcell.sandbox.container import is_podman, ulimits  # (container imports us)
    from sandcell.sandbox.limits import Limits

    container = client.containers.create(
        image, args, entrypoint=entrypoint, network_mode="none",
        ulimits=ulimits(Limits(), gvisor=False, podman=is_podman(client)), **options,
    )  # fmt: skip
    try:
        container.start()
        status = container.wait(timeout=120).get("StatusCode", 1)
        return status, container.logs().decode(errors="replace").strip()
    finally:
        container.remove(force=True)


def base_python(client: docker.DockerClient, base: str) -> str:
    """The base's Python as X.Y: the wheels must match it."""
    if not inspect(client, base).present:
        raise BuildError(
            f"the base image {base} is not on this engine: pull it first (`docker pull {base}`), "
            "or leave out --base to make one with debootstrap"
        )
    probe = "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"
    try:
        status, out = run_once(client, base, "python3", ["-c", probe])
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise BuildError(f"the base image {base} has no working python3 ({error})") from None
    if status != 0 or not re.fullmatch(r"\d+\.\d+", out):
        raise BuildError(f"the base image {base} has no working python3 ({out[-300:]})")
    return out


_PLATFORMS: dict[str, tuple[str, str]] = {}  # image id -> (Python X.Y, machine)


def image_platform(client: docker.DockerClient, image: str) -> tuple[str, str]:
    """The image's Python (X.Y) and machine (x86_64): from its label, else asked of its
    python3 once per image (an image sandcell did not build)."""
    found = client.images.get(image)
    if found.id not in _PLATFORMS:
        machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(
            found.attrs.get("Architecture", ""), found.attrs.get("Architecture", "")
        )
        python = (found.labels or {}).get(LABEL_PYTHON) or base_python(client, image)
        _PLATFORMS[found.id] = (python, machine)
    return _PLATFORMS[found.id]


def _normal(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Fixed owner, mode and time: the same bytes give the same context and the same layers."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode, info.mtime = 0o644, 0
    return info


def context_tar(wheels: Path, extra: Path | None, into: io.BufferedIOBase) -> None:
    """The build context: the sources, the contract, and the wheels under .wheels/ (read
    from the cache file by file, never all in memory). Links are followed: in a clone's
    editable install (strict mode) the sources are links to the clone's files."""
    with tarfile.open(fileobj=into, mode="w", dereference=True) as tar:
        for name, path in _source_paths():
            tar.add(path, arcname=name, filter=_normal)
        for path in sorted(wheels.glob("*.whl")):
            tar.add(path, arcname=f".wheels/{path.name}", filter=_normal)
        tar.add(wheels / "requirements.txt", arcname=".wheels/requirements.txt", filter=_normal)
        for path in sorted(extra.glob("*.whl")) if extra else []:
            tar.add(path, arcname=f".wheels/extra/{path.name}", filter=_normal)
        if extra:
            tar.add(extra / "requirements.txt", ".wheels/extra/requirements.txt", filter=_normal)
        else:  # the Dockerfile installs -r this file: empty when nothing extra was asked
            info = _normal(tarfile.TarInfo(".wheels/extra/requirements.txt"))
            tar.addfile(info, io.BytesIO(b""))
    into.seek(0)


STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")


def _build_steps(lines: Iterator[dict], built: list[str]) -> Iterator[tuple[int, int, str]]:
    """The engine's build stream as (step, steps, instruction); an error raises. The id of
    the image built goes into `built` (the stream's last `aux` says it, on both engines)."""
    for line in lines:
        if isinstance(line.get("aux"), dict) and line["aux"].get("ID"):
            built.append(line["aux"]["ID"])
        if "error" in line:
            detail = (line.get("errorDetail") or {}).get("message") or line["error"]
            raise BuildError(f"the image build failed: {detail.strip()}")
        match = STEP.match(line.get("stream", ""))
        if match:
            yield int(match[1]), int(match[2]), match[3].strip()


@dataclass(frozen=True)
class Built:
    name: str
    hash: str
    fresh: bool  # False: an image with this hash was already there; nothing was built


def build(
    client: docker.DockerClient,
    name: str,
    base: str | None = None,
    extra: Path | None = None,
    no_cache: bool = False,
    say: Say = lambda line: None,
    step: Callable[[int, int, str], None] = lambda i, n, what: None,
) -> Built:
    """Build the image `name` (and tag it with its hash) unless it is already current;
    no_cache builds it anew, layers and all."""
    base = base or DEFAULT_BASE
    arch = client.version().get("Arch", "amd64")
    if arch != "amd64":  # the wheels are downloaded for x86_64 (WHEEL_PLATFORMS)
        raise BuildError(
            f"the engine runs on {arch}: sandcell's image build downloads x86_64 wheels only "
            "for now; build on an x86_64 engine"
        )
    extra_text = extra.read_bytes() if extra else None
    wanted = image_hash(base, extra_text)
    before = inspect(client, name)
    if before.hash == wanted and not no_cache:
        return Built(name, wanted, fresh=False)
    if base == DEFAULT_BASE and not inspect(client, base).present:
        make_base(client, base, say)
    python = base_python(client, base)
    wheels = wheels_for(python, say)
    extra_wheels = extra_wheels_for(extra, python, wheels, say) if extra else None
    say(f"building {name} from {base}")
    repository = name.rpartition(":")[0] if ":" in name.rsplit("/", 1)[-1] else name
    with tempfile.TemporaryFile() as context:
        context_tar(wheels, extra_wheels, context)
        labels = {
            LABEL_HASH: wanted,
            LABEL_SOURCES: sources_hash(),
            LABEL_VERSION: sandcell_version(),
            LABEL_BASE: base,
            LABEL_PYTHON: python,
        }
        stream = client.api.build(
            fileobj=context,
            custom_context=True,
            tag=name,
            buildargs={"BASE": base},
            labels=labels,
            rm=True,
            forcerm=True,
            nocache=no_cache,
            decode=True,
        )
        built: list[str] = []
        for i, n, what in _build_steps(stream, built):
            step(i, n, what)
    # tagged by the id the build gave: under Podman a name may also mean an image loaded
    # with `podman load` (localhost/...), found first
    client.images.get(built[-1] if built else name).tag(repository, wanted)
    _untag(client, repository, before.hash, wanted)
    return Built(name, wanted, fresh=True)


def _untag(client: docker.DockerClient, repository: str, old: str | None, wanted: str) -> None:
    """The hash tag of the image this build replaces, removed."""
    if old and old != wanted:
        try:
            client.images.remove(f"{repository}:{old}", noprune=True)
        except docker.errors.APIError:
            pass  # gone already, or another tag's image: nothing to tidy


def smoke(client: docker.DockerClient, name: str, runtime: str) -> None:
    """The image's Python starts under `runtime` (with no network, as a sandbox would)."""
    try:
        status, out = run_once(
            client, name, "/opt/venv/bin/python", ["-c", "import ipykernel, pandas"],
            runtime=runtime,
        )  # fmt: skip
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        status, out = 1, str(error)
    if status != 0:
        raise BuildError(f"the image {name} does not start under the runtime {runtime}: {out}")


def repin(python: str = "3.11") -> None:
    """Developer task: re-resolve requirements.in into requirements.txt, keeping today's pins
    (delete a line from requirements.txt to upgrade it). `python scripts/repin_image.py`."""
    requirements = SOURCES_DIR / "requirements.txt"
    with tempfile.TemporaryDirectory() as pins:
        download_wheels(
            Path(pins), python, "-r", str(SOURCES_DIR / "requirements.in"), "-c", str(requirements)
        )
        names = sorted(
            (re.sub(r"^([^-]+)-([^-]+)-.*", r"\1==\2", p.name) for p in Path(pins).iterdir()),
            key=str.lower,
        )
    header = (
        f"# Pinned closure of requirements.in for Python {python} (the debootstrap base). "
        "Regenerate: python scripts/repin_image.py"
    )
    requirements.write_text("\n".join([header, *names]) + "\n")
    print(json.dumps({"requirements.txt": len(names)}))
