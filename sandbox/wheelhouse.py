"""The operator's wheelhouse: wheels with a PEP 503 index, mounted read-only into every
sandbox so that `%pip install NAME` works with no network.

    WHEELHOUSE/wheelhouse.json           the Python (X.Y) and machine it was made for
    WHEELHOUSE/wheels/NAME-V-TAGS.whl    the wheels (0644)
    WHEELHOUSE/simple/index.html         the projects; simple/NAME/index.html links each
                                         wheel as ../../wheels/FILE#sha256=HEX (pip checks it)

`add` resolves with the image's pins as constraints into a staging folder beside the
wheelhouse and moves the wheels in only once all were found; a refusal leaves it as it was.
Packages the image pins are never kept here: the image has them at that very version."""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import html
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from sandcell.sandbox import image_build

ENV = "SANDCELL_WHEELHOUSE"
MANIFEST = "wheelhouse.json"
WHEELS = "wheels"
INDEX = "simple"
MACHINE = "x86_64"  # what image_build.WHEEL_PLATFORMS download for
PROMPT_NAMES = 40  # the most names a prompt or a message lists


class WheelhouseError(Exception):
    """The wheelhouse cannot do what was asked; the message says what to do."""


def default_dir() -> Path:
    """$SANDCELL_WHEELHOUSE, else the cache's (SANDCELL_CACHE or ~/.cache/sandcell)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return image_build.cache_dir() / "wheelhouse"


DEFAULT = "default"  # Limits.wheelhouse: this machine's default one, when it exists


def resolve(given: str | None) -> str | None:
    """Limits.wheelhouse as a folder: DEFAULT is this machine's default wheelhouse when it
    exists (else none); a folder is itself."""
    if given != DEFAULT:
        return given
    here = Wheelhouse(default_dir())
    return str(here.path) if here.exists() else None


def on_this_machine(given: str | None) -> str | None:
    """The wheelhouse another machine (a Ray driver) named, as this machine has it: that folder
    when it is a wheelhouse here, else this machine's default one when it is, else the name
    (not mounted, the sandbox says so). None stays none."""
    if given is None or Wheelhouse(Path(given)).exists():
        return given
    here = Wheelhouse(default_dir())
    return str(here.path) if here.exists() else given


def normal(name: str) -> str:
    return canonicalize_name(name)


@dataclass(frozen=True)
class Wheel:
    project: str  # normalised (PEP 503)
    version: str
    path: Path


@dataclass
class Wheelhouse:
    path: Path

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def manifest(self) -> dict:
        try:
            data = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError) as error:
            raise WheelhouseError(
                f"{self.path} is not a sandcell wheelhouse ({MANIFEST}: {error}); make one with "
                "`sandcell packages add NAME`"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("python"), str):
            raise WheelhouseError(f"{self.manifest_path} names no Python; add a package again")
        return data

    @property
    def python(self) -> str:
        return self.manifest()["python"]

    def made_for(self) -> tuple[str, str]:
        """The Python (X.Y) and machine it was made for, from one read of its manifest."""
        manifest = self.manifest()
        return manifest["python"], str(manifest.get("machine", MACHINE))

    def wheels(self) -> list[Wheel]:
        found = []
        for path in sorted((self.path / WHEELS).glob("*.whl")):
            try:
                name, version, _, _ = parse_wheel_filename(path.name)
            except InvalidWheelFilename:
                continue
            found.append(Wheel(str(name), str(version), path))
        return found

    def packages(self) -> dict[str, list[str]]:
        """Each project and its versions, oldest first."""
        versions: dict[str, list[str]] = {}
        for wheel in self.wheels():
            versions.setdefault(wheel.project, []).append(wheel.version)
        return versions

    def size(self) -> int:
        return sum(w.path.stat().st_size for w in self.wheels())

    def stray_files(self) -> list[str]:
        """What the folder holds beyond its manifest, its wheels and their index: such a
        folder is not mounted (the sandbox would see it). Only regular files count as ours:
        wheels by a valid wheel name, and index pages where the index puts them."""
        allowed = {MANIFEST, WHEELS, INDEX}
        stray = [p.name for p in self.path.iterdir() if p.name not in allowed]
        projects = set(self.packages())
        pages = {f"{INDEX}/index.html"} | {f"{INDEX}/{p}/index.html" for p in projects}
        folders = {INDEX, WHEELS} | {f"{INDEX}/{p}" for p in projects}
        for path in self.path.rglob("*"):
            name = str(path.relative_to(self.path))
            if name == MANIFEST or not (
                name.startswith(f"{INDEX}/") or name.startswith(f"{WHEELS}/") or name in folders
            ):
                continue
            if path.is_symlink():
                stray.append(name)
            elif path.is_dir():
                stray += [] if name in folders else [name]
            elif not path.is_file():
                stray.append(name)
            elif name.startswith(f"{WHEELS}/"):
                stray += [] if _wheel_name(path.name) and path.parent.name == WHEELS else [name]
            elif name not in pages:
                stray.append(name)
        return sorted(stray)


def _wheel_name(name: str) -> bool:
    try:
        parse_wheel_filename(name)
    except InvalidWheelFilename:
        return False
    return True


# -- the index -----------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write(path: Path, text: str) -> None:
    """A file replaced whole (a sandbox reading the index never sees half a page)."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    os.chmod(temp, 0o644)
    os.replace(temp, path)


def index_hash(folder: Path) -> str:
    """The wheelhouse's index as one digest (every page: which wheels, by their sha256): what a
    paused sandbox's restore compares, never the folder's path, which differs per machine."""
    digest = hashlib.sha256()
    for page in sorted((folder / INDEX).rglob("index.html")):
        digest.update(str(page.relative_to(folder)).encode() + b"\0" + page.read_bytes())
    return digest.hexdigest()


def write_index(house: Wheelhouse) -> None:
    """simple/ from the wheels there now: one page per project, a sha256 on every link."""
    projects: dict[str, list[Wheel]] = {}
    for wheel in house.wheels():
        projects.setdefault(wheel.project, []).append(wheel)
    root = house.path / INDEX
    for project, wheels in projects.items():
        links = "".join(
            f'<a href="../../{WHEELS}/{quote(w.path.name)}#sha256={_sha256(w.path)}">'
            f"{html.escape(w.path.name)}</a><br>\n"
            for w in wheels
        )
        _write(
            root / project / "index.html", f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n"
        )
    for page in root.glob("*/"):
        if page.is_dir() and page.name not in projects:
            shutil.rmtree(page)
    listing = "".join(f'<a href="{p}/">{p}</a><br>\n' for p in sorted(projects))
    _write(root / "index.html", f"<!DOCTYPE html>\n<html><body>\n{listing}</body></html>\n")


@contextmanager
def _locked(house: Wheelhouse) -> Iterator[None]:
    """One change at a time (two `packages add` at once would index each other's halves)."""
    house.path.parent.mkdir(parents=True, exist_ok=True)
    with open(house.path.parent / f".{house.path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# -- adding and removing -------------------------------------------------------------------


def image_pins() -> dict[str, str]:
    """The image's pinned packages (its requirements.txt): normalised name -> version."""
    pins = {}
    for line in (image_build.SOURCES_DIR / "requirements.txt").read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not line.startswith("#"):
            pins[normal(name)] = version.strip()
    return pins


def _check_local_wheel(path: Path) -> None:
    try:
        parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as archive:
            if archive.testzip() is not None:
                raise zipfile.BadZipFile("a damaged member")
    except (InvalidWheelFilename, zipfile.BadZipFile, OSError) as error:
        raise WheelhouseError(f"{path} is not a usable wheel ({error})") from None


@dataclass
class Added:
    wheels: list[str] = field(default_factory=list)  # file names moved in
    already: list[str] = field(default_factory=list)  # there before
    in_image: list[str] = field(default_factory=list)  # name==version the image has


def add(
    house: Wheelhouse,
    requirements: list[str],
    requirement_files: list[Path],
    local_wheels: list[Path],
    python: str,
    say: image_build.Say = lambda line: None,
) -> Added:
    """Resolve what was asked (and what it needs) for `python` on x86_64 Linux, held to the
    image's pins, and move the new wheels in. Only wheels: a package with none for this
    Python is refused (sandcell builds nothing from source)."""
    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise WheelhouseError(f"--python {python!r} is not a Python version such as 3.11")
    for path in local_wheels:
        _check_local_wheel(path)
    with _locked(house):
        if house.exists() and house.python != python:
            raise WheelhouseError(
                f"the wheelhouse {house.path} is for Python {house.python}, not {python}: use "
                f"another folder (--wheelhouse or ${ENV}) for that Python"
            )
        staging = Path(
            tempfile.mkdtemp(prefix=f".{house.path.name}-staging-", dir=house.path.parent)
        )
        try:
            _download(house, staging, requirements, requirement_files, local_wheels, python, say)
            return _move_in(house, staging, python)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _download(
    house: Wheelhouse,
    staging: Path,
    requirements: list[str],
    requirement_files: list[Path],
    local_wheels: list[Path],
    python: str,
    say: image_build.Say,
) -> None:
    pins = image_build.SOURCES_DIR / "requirements.txt"
    links = [house.path / WHEELS, *image_build.cache_dir().glob(f"image-wheels/*-py{python}")]
    args = [a for link in links if link.is_dir() for a in ("--find-links", str(link))]
    for path in requirement_files:
        args += ["-r", str(path)]
    args += [*requirements, *(str(p.resolve()) for p in local_wheels), "-c", str(pins)]
    say(f"resolving {len(requirements) + len(local_wheels) + len(requirement_files)} "
        f"requirement(s) for Python {python}, held to the image's pins")  # fmt: skip
    try:
        image_build.download_wheels(staging, python, *args)
    except image_build.BuildError as error:
        raise WheelhouseError(_refusal(str(error), python)) from None


def _refusal(pip_said: str, python: str) -> str:
    """pip's refusal as a reason: the conflict, the missing wheel, or the index unreached."""
    said = pip_said.split(":\n", 1)[-1].strip()
    if "conflict" in said.lower() or "ResolutionImpossible" in said:
        why = "it conflicts with a package the image pins (or with itself)"
    elif "No matching distribution" in said or "Could not find a version" in said:
        why = (
            f"no wheel for Python {python} on x86_64 Linux was found (sandcell installs wheels "
            "only: build one with `pip wheel NAME` and add the .whl), or the index is unreachable"
        )
    else:
        why = "pip refused"
    return f"nothing was added ({why}); the wheelhouse is unchanged. pip said:\n{said}"


def _move_in(house: Wheelhouse, staging: Path, python: str) -> Added:
    pins, added = image_pins(), Added()
    have = {w.path.name: w.path for w in house.wheels()}
    new = []
    for path in sorted(staging.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if pins.get(str(name)) == str(version):
            added.in_image.append(f"{name}=={version}")
        elif path.name not in have:
            new.append(path)
        elif _sha256(path) == _sha256(have[path.name]):
            added.already.append(path.name)
        else:  # never two files of one name: the index would say the old hash
            raise WheelhouseError(
                f"nothing was added: {path.name} is in the wheelhouse already with other bytes; "
                f"remove it first (`sandcell packages remove {name}`) if the new one is right"
            )
    wheels = house.path / WHEELS
    wheels.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(house.path, 0o755)
    os.chmod(wheels, 0o755)
    for path in new:
        os.chmod(path, 0o644)
        os.replace(path, wheels / path.name)  # the same filesystem: staging is a sibling
        added.wheels.append(path.name)
    if not house.exists():
        _write(house.manifest_path, json.dumps({"python": python, "machine": MACHINE}) + "\n")
    write_index(house)
    return added


def remove(house: Wheelhouse, name: str) -> list[str]:
    """Every wheel of the project `name`; the file names removed."""
    with _locked(house):
        project = normal(name)
        gone = [w for w in house.wheels() if w.project == project]
        if not gone:
            raise WheelhouseError(f"{name} is not in the wheelhouse{_closest(name, house)}")
        for wheel in gone:
            wheel.path.unlink()
        write_index(house)
        return [w.path.name for w in gone]


def _closest(name: str, house: Wheelhouse) -> str:
    close = difflib.get_close_matches(normal(name), list(house.packages()), n=3, cutoff=0.6)
    return f" (closest: {', '.join(close)})" if close else ""


# -- what a sandbox is offered -------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    """What a sandbox gets of a wheelhouse: the folder to mount (None: nothing), the
    packages it offers, and when it is not mounted, why."""

    mount: Path | None = None
    packages: tuple[str, ...] = ()
    refused: str = ""


def offer(folder: str | Path | None, python: str, machine: str) -> Offer:
    """Whether the wheelhouse `folder` fits an image with this Python (X.Y) and machine."""
    folder = resolve(str(folder) if folder is not None else None)
    if folder is None:
        return Offer()
    house = Wheelhouse(Path(folder))
    if not house.exists():
        return Offer(refused=f"the wheelhouse {folder} is missing or has no {MANIFEST}")
    try:
        made_for = house.made_for()
        stray = house.stray_files()
    except (WheelhouseError, OSError) as error:
        return Offer(refused=f"the wheelhouse {folder} cannot be read ({error})")
    if made_for != (python, machine):
        return Offer(
            refused=f"the wheelhouse {folder} was made for Python {made_for[0]} on {made_for[1]}, "
            f"the image has Python {python} on {machine}: it is not mounted. Make one for this "
            f"image: `sandcell packages add --python {python} ...` into another folder"
        )
    if stray:
        return Offer(
            refused=f"the wheelhouse {folder} holds files that are not indexed wheels "
            f"({', '.join(stray[:5])}): it is not mounted. Remove them."
        )
    return Offer(mount=house.path.resolve(), packages=tuple(sorted(house.packages())))
