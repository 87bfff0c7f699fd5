"""Which way the host reaches a sandbox's kernel and inputs: `ipc` (socket files and input
files in folders the engine bind-mounts: a local Linux engine that sees this machine's
folders) or `stream` (everything through the engine's API: exec streams, a volume for the
inputs; any engine the API reaches). `auto` picks `ipc` where it works and `stream` otherwise,
once per engine per process."""

import contextlib
import os
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests
from docker.types import Mount

from sandcell.sandbox import container
from sandcell.sandbox.errors import SandboxUnavailable
from sandcell.sandbox.limits import Limits

TRANSPORTS = ("auto", "ipc", "stream")


@dataclass(frozen=True)
class Choice:
    name: str  # "ipc" or "stream"
    why: str


_chosen: dict[str, Choice] = {}  # per engine (its address), for this process
_lock = threading.Lock()


def engine_address(client: docker.DockerClient) -> str:
    """The engine as its user named it (DOCKER_HOST), else the client's own address."""
    return os.environ.get("DOCKER_HOST") or str(client.api.base_url).replace(
        "http+docker://localhost", "unix:///var/run/docker.sock"
    )


def is_local_socket(client: docker.DockerClient) -> bool:
    """The engine is reached through a Unix socket of this machine."""
    return str(client.api.base_url).startswith(
        ("http+docker://localhost", "http+docker://localunixsocket")
    )


def choose(client: docker.DockerClient, asked: str, image: str) -> Choice:
    """The transport for sandboxes on this engine: `asked`, or what `auto` finds."""
    if asked not in TRANSPORTS:
        raise SandboxUnavailable(f"no transport {asked!r}: use one of {', '.join(TRANSPORTS)}")
    if asked == "stream":
        return Choice("stream", "asked for (--transport stream)")
    found = _auto(client, image)
    if asked == "ipc":
        if found.name != "ipc":
            raise SandboxUnavailable(
                f"--transport ipc needs a local engine that sees this machine's folders, and "
                f"{found.why}: use --transport stream (or auto)"
            )
        return Choice("ipc", "asked for (--transport ipc)")
    return found


def _auto(client: docker.DockerClient, image: str) -> Choice:
    address = engine_address(client)
    with _lock:
        if address in _chosen:
            return _chosen[address]
        found, sure = _find(client, image, address)
        if sure:  # a probe the engine failed for another reason is asked again next time
            _chosen[address] = found
        return found


def _find(client: docker.DockerClient, image: str, address: str) -> tuple[Choice, bool]:
    """What `auto` takes, and whether that is sure (else it is not kept)."""
    if not is_local_socket(client):
        return Choice("stream", f"the engine is remote ({address})"), True
    if sys.platform != "linux":  # a VM's engine (OrbStack, Colima): sockets do not cross shares
        return Choice("stream", f"this machine is not Linux ({sys.platform})"), True
    system = str(client.info().get("OperatingSystem", ""))
    if "Docker Desktop" in system:
        return Choice("stream", "the engine is Docker Desktop's, in a virtual machine"), True
    seen = sees_host_folders(client, image)
    if seen:
        return Choice("ipc", f"the engine at {address} sees this machine's folders"), True
    why = "cannot see this machine's folders" if seen is False else "could not be probed"
    return Choice("stream", f"the engine at {address} {why}"), seen is False


def sees_host_folders(client: docker.DockerClient, image: str) -> bool | None:
    """Whether the engine can bind-mount a folder this process just made (None: the probe
    failed otherwise). Docker: a container is created with it (never started), which an
    engine on another machine refuses (no such path there). Podman makes a missing path
    instead, so there the container runs and looks for a file of the folder."""
    podman = container.is_podman(client)
    name = f"sandcell-probe-{uuid.uuid4().hex[:12]}"  # removed by name, however create ended
    with tempfile.TemporaryDirectory(prefix="sandcell-probe-") as folder:
        Path(folder, "seen").touch()
        os.chmod(folder, 0o755)  # the image's user looks in it (an empty file, its only one)
        try:
            probe = client.containers.create(
                image,
                ["-c", "test -f /probe/seen"],
                name=name,
                entrypoint=["sh"],
                network_mode="none",
                mounts=[Mount(target="/probe", source=folder, type="bind", read_only=True)],
                ulimits=container.ulimits(Limits(), gvisor=False, podman=podman),
                labels=container.labels("transport-probe", helper=True),  # reaped if we die
            )
            if not podman:
                return True
            probe.start()
            return probe.wait(timeout=60).get("StatusCode") == 0
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(
                f"the sandbox image {image} is missing. Build it with `sandcell image build`."
            ) from None
        except docker.errors.APIError as error:
            return False if "does not exist" in str(error) else None
        except requests.exceptions.RequestException:
            return None
        finally:  # also when a signal ended the create before its answer came
            with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
                client.api.remove_container(name, force=True)
