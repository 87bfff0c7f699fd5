"""A paused sandbox on disk: its container's checkpoint (gVisor saves the whole sandbox, the
kernel's memory with it) kept in a folder the caller owns, and what a restore must match.

    FOLDER/checkpoint/   the engine's checkpoint, copied out of its data root (owner-only)
    FOLDER/pause.json    the kernel's connection (its key), the image, runsc's version and
                         the mounts (a restore must match them), and the limits (recorded)
    FOLDER/pause.hmac    HMAC-SHA256 over both, with a key kept outside every session folder:
                         a restore refuses a checkpoint this machine did not write

Docker's checkpoints need the engine's `experimental` setting and a local engine (the folder is
copied in and out of its data root, which takes root), and runsc: CRIU, which runc would use,
fails on kernels like this machine's."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from sandcell.sandbox import image_build
from sandcell.sandbox.errors import SandboxError

NAME = "sandcell-pause"  # the checkpoint's name in the engine
STATE = "pause.json"
SEAL = "pause.hmac"
SAVED = "checkpoint"
KEY_FILE = "checkpoint.key"


class PauseError(SandboxError):
    """A pause or a resume could not be done; the message says why (the caller falls back)."""


def key() -> bytes:
    """This machine's checkpoint key: made once (whole: written aside, then linked into
    place), owner-only, beside the image cache (never in a session folder, where a digest
    would protect nothing). A key file not of this shape is refused."""
    path = image_build.cache_dir() / KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        temp = path.with_name(f".{KEY_FILE}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(temp, path)  # fails if another process made it first: theirs is used
        except FileExistsError:
            pass
        finally:
            temp.unlink()
    st = path.lstat()
    secret = path.read_bytes().strip()
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_mode & 0o077
        or st.st_uid != os.getuid()
        or len(secret) != 64
    ):
        raise PauseError(f"{path} is not this user's owner-only checkpoint key: remove it")
    return secret


def runsc_version(client: docker.DockerClient, runtime: str) -> str:
    """The version the engine's runsc says: a restore under another one is refused."""
    entry = (client.info().get("Runtimes") or {}).get(runtime) or {}
    binary = entry.get("path") or "runsc"
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unknown ({error})"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown"


def _engine_folder(client: docker.DockerClient, container_id: str) -> Path:
    return Path(client.info()["DockerRootDir"]) / "containers" / container_id / "checkpoints"


def _api_error(error: Exception) -> str:
    return str(getattr(error, "explanation", None) or error)


def create(client: docker.DockerClient, container_id: str) -> None:
    """Checkpoint the container into the engine's folder (the container stops)."""
    api = client.api
    try:
        response = api._post_json(
            api._url("/containers/{0}/checkpoints", container_id),
            data={"CheckpointID": NAME, "Exit": True},
        )
        api._raise_for_status(response)
    except (docker.errors.APIError, requests.RequestException) as error:
        raise PauseError(
            f"the engine could not checkpoint the sandbox: {_api_error(error)}"
        ) from None


def copy_out(client: docker.DockerClient, container_id: str, into: Path) -> None:
    """The engine's checkpoint copied into `into`, owner-only."""
    saved = _engine_folder(client, container_id) / NAME
    try:
        shutil.copytree(saved, into, symlinks=True)
        _owner_only(into)
    except OSError as error:
        raise PauseError(f"the checkpoint could not be copied out of {saved}: {error}") from None


def forget(client: docker.DockerClient, container_id: str) -> None:
    """The engine's copy of a checkpoint removed (a later pause makes its own, same name)."""
    shutil.rmtree(_engine_folder(client, container_id) / NAME, ignore_errors=True)


def engine_reachable(client: docker.DockerClient, container_id: str) -> None:
    """PauseError unless the engine's checkpoint folder can be reached from here (a local
    engine, and root): said before anything is stopped."""
    folder = _engine_folder(client, container_id).parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PauseError(
            f"the engine's folder {folder} cannot be written from here (a remote engine, or not "
            "root): checkpoints are copied in and out of it"
        )


def start_from(client: docker.DockerClient, container_id: str) -> None:
    """Start the container from the checkpoint in its engine folder."""
    api = client.api
    try:
        response = api._post(
            api._url("/containers/{0}/start", container_id), params={"checkpoint": NAME}
        )
        api._raise_for_status(response)
    except (docker.errors.APIError, requests.RequestException) as error:
        raise PauseError(f"the engine could not restore the sandbox: {_api_error(error)}") from None


def restore_into(client: docker.DockerClient, container_id: str, saved: Path) -> None:
    """Start the created container from the checkpoint in `saved` (copied into the engine's
    data root: this engine refuses a checkpoint folder of its own choosing), then remove
    that copy (a later pause makes its own, under the same name)."""
    target = _engine_folder(client, container_id) / NAME
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(saved, target, symlinks=True)
    except OSError as error:
        raise PauseError(
            f"the checkpoint could not be put where the engine reads it: {error}"
        ) from None
    try:
        start_from(client, container_id)
    finally:
        forget(client, container_id)


def size(folder: Path) -> int:
    """Bytes a paused sandbox's folder takes (its checkpoint, the state and the seal)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def seal(folder: Path) -> None:
    """Seal the pause in `folder` with this machine's key (owner-only): one written here, or
    one that came from a Ray node's engine (checked on its node first) or back to one."""
    _owner_only(folder)
    (folder / SEAL).write_text(_digest(folder, key()))
    os.chmod(folder / SEAL, 0o600)


def _owner_only(folder: Path) -> None:
    os.chmod(folder, 0o700)
    for path in folder.rglob("*"):
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


def _digest(folder: Path, secret: bytes) -> str:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    found = sorted((folder / SAVED).rglob("*"))
    odd = [p for p in found if p.is_symlink() or not (p.is_file() or p.is_dir())]
    if odd:  # a link would be followed by the copy into the engine, unhashed
        raise PauseError(f"the checkpoint in {folder} holds {odd[0].name}, not a plain file")
    paths = [folder / STATE, *(p for p in found if p.is_file())]
    for path in paths:
        name = str(path.relative_to(folder)).encode()
        mac.update(len(name).to_bytes(8, "big") + name + path.stat().st_size.to_bytes(8, "big"))
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                mac.update(block)
    return mac.hexdigest()


@dataclass(frozen=True)
class Paused:
    """What a restore needs and must match, as pause.json holds it."""

    connection: dict  # the kernel's connection info, its key with it
    image_id: str
    runsc: str
    mounts: dict  # inputs (name -> sha256) and the wheelhouse, as mounted
    limits: dict

    def write(self, folder: Path) -> None:
        path = folder / STATE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.__dict__, f)
        seal(folder)

    @classmethod
    def read(cls, folder: Path) -> Paused:
        """The pause in `folder`, once its HMAC holds; PauseError otherwise."""
        try:
            said = (folder / SEAL).read_bytes().strip()
            ok = hmac.compare_digest(said, _digest(folder, key()).encode())
            state: dict[str, Any] = json.loads((folder / STATE).read_text()) if ok else {}
        except (OSError, ValueError) as error:
            raise PauseError(f"the paused sandbox in {folder} cannot be read ({error})") from None
        if not ok:
            raise PauseError(
                f"the checkpoint in {folder} was not written by this machine's sandcell (its "
                "HMAC does not hold): it is not restored"
            )
        return cls(**state)
