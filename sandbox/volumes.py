"""A sandbox's volumes over the stream transport: its inputs, and its bridge's key folder.

Inputs through the engine's API: a named volume per sandbox, mounted read-only at /data.

Where the engine cannot see the host's files (the stream transport), none can be bind-mounted.
The sandbox's root filesystem is read-only and the archive API sees no tmpfs, and inputs also
arrive after the start (add_inputs, renew), so they go into a volume of the sandbox's own,
filled by a short-lived helper container of the same image: the archive API writes into a
helper that never needs to start; emptying it for a renewal runs one. The tar is streamed from
the host's files (a 1 GB input is never held in memory), each member a plain file, read-only.
"""

import os
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import requests

from sandcell.sandbox import boundary, container
from sandcell.sandbox.errors import SandboxError

CHUNK = 1 << 20
EMPTY_WAIT_S = 60


def create(client: docker.DockerClient, labels: dict[str, str]) -> str:
    """A new volume for the inputs, carrying the sandbox's labels (the reaper finds it)."""
    name = f"sandcell-data-{uuid.uuid4().hex[:16]}"
    client.volumes.create(name=name, labels=labels)
    return name


def create_key(client: docker.DockerClient, labels: dict[str, str], owner: int, group: int) -> str:
    """A new volume in memory (tmpfs) for the bridge's connection files, owned by the bridge's
    uid: model code cannot write there. A volume rather than a tmpfs mount because Podman
    gives a tmpfs mount no owner but the container's user; in memory so that nothing of it
    outlives the sandbox on the engine's disk."""
    name = f"sandcell-key-{uuid.uuid4().hex[:16]}"
    options = f"uid={owner},gid={group},mode=0755,nosuid,nodev,noexec"
    if not container.is_podman(client):  # Podman refuses a size without project quotas
        options += ",size=64k"
    client.volumes.create(
        name=name, driver="local", labels=labels,
        driver_opts={"type": "tmpfs", "device": "tmpfs", "o": options},
    )  # fmt: skip
    return name


def fill(
    client: docker.DockerClient,
    image: str,
    volume: str,
    inputs: dict[str, Path],
    helper_options: dict,
    emptied: bool = False,
) -> None:
    """Put `inputs` (name -> host file) into the volume; with `emptied`, remove what it
    held first. `helper_options`: what every container sandcell makes carries (limits,
    labels, ulimits)."""
    if not inputs and not emptied:
        return
    helper = client.containers.create(
        image=image,
        entrypoint=["find", boundary.DATA, "-mindepth", "1", "-delete"],
        volumes={volume: {"bind": boundary.DATA, "mode": "rw"}},
        user="0:0",  # the files are root's, read-only to the sandbox
        **helper_options,
    )
    try:
        if emptied:
            helper.start()
            status = helper.wait(timeout=EMPTY_WAIT_S).get("StatusCode")
            if status != 0:
                raise SandboxError(f"the sandbox's inputs could not be removed (exit {status})")
        if inputs and not helper.put_archive(boundary.DATA, tar_stream(inputs)):
            raise SandboxError("the engine did not take the sandbox's inputs")
    except (docker.errors.APIError, requests.exceptions.RequestException) as error:
        raise SandboxError(f"the sandbox's inputs could not be copied: {error}") from None
    finally:
        helper.remove(force=True)


def tar_stream(inputs: dict[str, Path]) -> Iterator[bytes]:
    """A tar of `inputs`, made as it is sent: each a regular file of mode 0444, owned by
    root. A file that changes size while it is read fails the copy."""
    for name, path in inputs.items():
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            member = tarfile.TarInfo(name)
            member.size, member.mode, member.mtime = size, 0o444, int(time.time())
            yield member.tobuf(format=tarfile.PAX_FORMAT)
            left = size
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise SandboxError(f"the input {name} shrank while it was copied")
                left -= len(chunk)
                yield chunk
            if f.read(1):
                raise SandboxError(f"the input {name} grew while it was copied")
        if size % tarfile.BLOCKSIZE:
            yield b"\0" * (tarfile.BLOCKSIZE - size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def remove(client: docker.DockerClient, volume: str) -> None:
    """Remove the volume; gone already is fine."""
    try:
        client.api.remove_volume(volume, force=True)
    except docker.errors.NotFound:
        pass
