"""`sandcell doctor`'s checks: what a run needs from this machine, each with how to fix a miss.

Each check says ok, warn (works, but worth knowing) or fail (a run cannot work so); the ones
that need the engine are skipped when it does not answer. Every call is bounded (the engine's
ping, the endpoint's /models), so a stopped engine or a silent server is said in seconds."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import requests

from sandcell.agent.model.settings import API_KEY_ENV, BASE_URL_ENV, ModelSettings, endpoint_in
from sandcell.sandbox import image_build
from sandcell.sandbox.container import (
    DEFAULT_IMAGE,
    PING_TIMEOUT_S,
    RUNSC_ARGS,
    is_podman,
    runtime_is_gvisor,
)
from sandcell.sandbox.errors import SandboxUnavailable

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
MODELS_TIMEOUT_S = 10
LOW_DISK, TOO_LITTLE_DISK = 4 << 30, 1 << 30  # an image build needs about 3 GB


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def _engine_fix(error: BaseException) -> str:
    """How to fix an engine that does not answer, from how it failed."""
    chain: BaseException | None = error
    said = str(error)
    while chain is not None:  # the OSError under docker's and requests' wrappers
        if isinstance(chain, PermissionError) or getattr(chain, "errno", None) == errno.EACCES:
            return (
                "your user may not use the engine's socket: `sudo usermod -aG docker $USER`, "
                "then log in again (or run as root)"
            )
        chain = chain.__cause__ or chain.__context__
    if "timed out" in said:
        return (
            f"the engine accepted the connection but did not answer in {PING_TIMEOUT_S} s: it "
            "is stopped or overloaded; restart it (`sudo systemctl restart docker`)"
        )
    return (
        "start it: `sudo systemctl start docker` (or `sudo dockerd &` where there is no "
        "systemd; from a clone, `make engine`); DOCKER_HOST names another engine"
    )


def engine() -> tuple[docker.DockerClient | None, Check]:
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        client = docker.from_env(timeout=PING_TIMEOUT_S)
        client.ping()
        info = client.version()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        detail = " ".join(str(error).split())[:200]
        return None, Check(
            "engine", FAIL, f"no Docker engine answers ({detail})", _engine_fix(error)
        )
    kind = "Podman" if is_podman(client) else "Docker"
    return client, Check("engine", OK, f"{kind} {info.get('Version', '?')} at {where}")


def image(client: docker.DockerClient) -> Check:
    state = image_build.inspect(client, DEFAULT_IMAGE)
    if state.current:
        return Check("image", OK, state.describe())
    if not state.present:
        return Check("image", FAIL, f"{state.name} is missing", "sandcell image build")
    return Check(
        "image", FAIL, f"{state.name} was built from other sources ({state.sources or 'unknown'}) "
        f"than this sandcell's ({image_build.sources_hash()})", "sandcell image build",
    )  # fmt: skip


def runtimes(info: dict, runtime: str | None) -> Check:
    """The runtime asked for (--runtime, SANDCELL_RUNTIME) must be registered as the sandbox
    needs; with none asked, say what there is (gVisor is optional)."""
    known = sorted(info.get("Runtimes") or {})
    default = info.get("DefaultRuntime", "runc")
    if runtime:
        try:
            runtime_is_gvisor(info, runtime)
        except SandboxUnavailable as error:
            return Check("runtime", FAIL, str(error), _runsc_fix())
        return Check("runtime", OK, f"{runtime} is registered as the sandbox needs")
    if "runsc" not in known:
        return Check(
            "runtime", OK, f"{default} (the engine's default); gVisor's runsc is not registered "
            "(optional: a stronger sandbox, `--runtime runsc`)",
        )  # fmt: skip
    try:
        runtime_is_gvisor(info, "runsc")
    except SandboxUnavailable as error:
        return Check("runtime", WARN, str(error), _runsc_fix())
    return Check("runtime", OK, f"{default} (default); runsc registered for `--runtime runsc`")


def podman_runtime(runtime: str | None) -> Check:
    """Podman's Docker API ignores a container's runtime: gVisor cannot be asked of it."""
    if runtime and runtime != "runc":
        return Check(
            "runtime", FAIL, f"Podman's Docker API takes no runtime: {runtime} cannot be asked "
            "of it (its containers run under its own runtime)",
            "leave --runtime out on Podman, or use a Docker engine with runsc for gVisor",
        )  # fmt: skip
    return Check("runtime", OK, "Podman's own (its Docker API takes no runtime: no gVisor)")


def _runsc_fix() -> str:
    args = ", ".join(f'"{a}"' for a in RUNSC_ARGS)
    return (
        'in /etc/docker/daemon.json: "runtimes": {"runsc": {"path": "/usr/bin/runsc", '
        f'"runtimeArgs": [{args}]}}}}, then restart the engine (from a clone: '
        "`make engine RUNTIME=runsc` does it)"
    )


def model(settings: ModelSettings, env: dict[str, str], given: bool = False) -> Check:
    """The endpoint answers /models with this key; the model's name is listed (a warning if
    not: some servers answer to any name)."""
    if not given and not endpoint_in(env) and settings.api_key is None:
        return Check(
            "model", WARN, "no endpoint configured (exec, image and mcp need none)",
            f"for run, chat, batch and serve: set {BASE_URL_ENV} to a local server "
            f"(llama.cpp, vLLM, Ollama) or {API_KEY_ENV}",
        )  # fmt: skip
    import openai

    client = openai.OpenAI(
        base_url=settings.base_url, api_key=settings.api_key or "sk-local",
        timeout=MODELS_TIMEOUT_S, max_retries=0,
    )  # fmt: skip
    where = settings.where
    try:
        names = [m.id for m in client.models.list().data][:1000]
    except openai.AuthenticationError:
        return Check("model", FAIL, f"{where} refused the key", f"check {API_KEY_ENV}")
    except openai.NotFoundError:
        return Check("model", WARN, f"{where} answers but has no /models: the name is unchecked")
    except openai.APIStatusError as error:
        return Check("model", FAIL, f"{where} answered /models with HTTP {error.status_code}",
                     "check the server's log; is it an OpenAI-compatible endpoint?")  # fmt: skip
    except openai.APIError as error:
        return Check(
            "model", FAIL, f"no answer from {where} in {MODELS_TIMEOUT_S} s ({error})",
            f"start the server, or fix {BASE_URL_ENV} (it ends in /v1 for most servers)",
        )  # fmt: skip
    if settings.name in names:
        return Check("model", OK, f"{where} answers and serves {settings.name}")
    listed = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    return Check(
        "model", WARN, f"{where} answers but does not list {settings.name} (it has: {listed})",
        "set SANDCELL_MODEL (or --model) to one it serves",
    )  # fmt: skip


def disk(info: dict | None) -> Check:
    """Free space where the images live (the engine's root, when this host can see it), the
    wheel cache and the temp folder (traces, uploads)."""
    places = [Path(tempfile.gettempdir()), image_build.cache_dir()]
    if info and info.get("DockerRootDir"):
        places.insert(0, Path(info["DockerRootDir"]))
    free = {}
    for place in places:
        while not place.exists() and place != place.parent:
            place = place.parent
        try:
            free[str(place)] = shutil.disk_usage(place).free
        except OSError:
            continue
    if not free:
        return Check("disk", WARN, "could not read the free space")
    where, least = min(free.items(), key=lambda item: item[1])
    said = f"{least / 2**30:.1f} GiB free at {where}"
    if least < TOO_LITTLE_DISK:
        return Check("disk", FAIL, said, "free some space (`docker system prune` removes "
                     "stopped containers and dangling images)")  # fmt: skip
    if least < LOW_DISK:
        return Check("disk", WARN, said, "an image build needs about 3 GiB")
    return Check("disk", OK, said)


CGROUP_FEATURES = {  # docker info's flag -> the limit that needs it
    "MemoryLimit": "--memory",
    "CpuCfsQuota": "--cpus",
    "PidsLimit": "the process limit",
}


def cgroups(info: dict) -> Check:
    missing = [limit for flag, limit in CGROUP_FEATURES.items() if info.get(flag) is False]
    version = f"cgroup v{info.get('CgroupVersion', '?')} ({info.get('CgroupDriver', '?')})"
    if missing:
        return Check(
            "cgroups", FAIL, f"{version}: the engine cannot enforce {', '.join(missing)}",
            "enable the memory, cpu and pids cgroup controllers (kernel command line "
            "`cgroup_enable=memory`, or a systemd with cgroup v2), then restart the engine",
        )  # fmt: skip
    if info.get("SwapLimit") is False:
        return Check(
            "cgroups", WARN, f"{version}: no swap limit; a sandbox may swap past --memory",
            "boot with `swapaccount=1` (cgroup v1) or use cgroup v2",
        )  # fmt: skip
    return Check("cgroups", OK, f"{version}: memory, cpu, pids and swap limits enforced")


def packages(client: docker.DockerClient | None, image: str = DEFAULT_IMAGE) -> Check:
    """The default wheelhouse (`sandcell packages`): what it offers, and whether it fits the
    image (its Python and machine), so that sandboxes mount it."""
    from sandcell.sandbox.docker_sandbox import wheelhouse_offer
    from sandcell.sandbox.wheelhouse import Wheelhouse, WheelhouseError, default_dir

    house = Wheelhouse(default_dir())
    if not house.exists():
        return Check("packages", OK, f"no wheelhouse at {house.path}: the image's packages only "
                     "(add more with `sandcell packages add NAME`)")  # fmt: skip
    try:
        count, size, made_for = len(house.packages()), house.size(), house.made_for()
    except (OSError, ValueError, WheelhouseError) as error:
        return Check("packages", FAIL, f"the wheelhouse {house.path} cannot be read ({error})",
                     "remove the folder, then `sandcell packages add NAME` again")  # fmt: skip
    said = f"{house.path}: {count} package(s), {size / 1e6:.1f} MB, for Python {made_for[0]} on {made_for[1]}"
    if client is None:
        return Check("packages", WARN, f"{said}; the image's Python is unknown without the engine")
    offered = wheelhouse_offer(client, image, str(house.path))
    if offered.mount is None:
        fix = "build the image, or make a wheelhouse for its Python (`sandcell packages add`)"
        return Check("packages", WARN, f"{said}; not mounted: {offered.refused}", fix)
    return Check("packages", OK, f"{said}; mounted read-only into every sandbox")


def pausing(info: dict) -> Check:
    """Whether a paused sandbox can keep its kernel: gVisor's runsc registered, the engine's
    experimental setting on (Docker's checkpoints), and its data root reachable from here (the
    checkpoint is copied in and out: a local engine, root)."""
    if "runsc" not in (info.get("Runtimes") or {}):
        return Check("pausing", OK, "off: without runsc an idle or restarted session gets a "
                     "fresh kernel, or its cells replayed")  # fmt: skip
    if not info.get("ExperimentalBuild"):
        return Check(
            "pausing", WARN, 'the engine\'s checkpoints are off (no "experimental": true): '
            "sessions under runsc fall back to a fresh kernel or a replay",
            'add "experimental": true to /etc/docker/daemon.json and restart dockerd '
            "(`sudo systemctl restart docker`: it stops every running container)",
        )  # fmt: skip
    root = Path(info.get("DockerRootDir") or "/var/lib/docker")
    if not os.access(root / "containers", os.W_OK):
        return Check("pausing", WARN, f"checkpoints are on, but {root} is not writable from "
                     "here (a remote engine, or not root): paused sessions fall back",
                     "run sandcell as root on the engine's host")  # fmt: skip
    return Check(
        "pausing", OK, "checkpoints work under runsc: idle and restarted sessions keep their kernel"
    )


def transports(client: docker.DockerClient, asked: str) -> Check:
    """Which way the host reaches sandboxes on this engine, and why (sandbox/transport.py)."""
    from sandcell.sandbox.transport import choose

    if not image_build.inspect(client, DEFAULT_IMAGE).present:
        return Check("transport", SKIP, "needs the image (its probe creates a container of it)")
    try:
        chosen = choose(client, asked, DEFAULT_IMAGE)
    except SandboxUnavailable as error:
        return Check("transport", FAIL, str(error), "use --transport auto (or stream)")
    if chosen.name == "ipc":
        return Check("transport", OK, f"ipc: {chosen.why}")
    return Check(
        "transport", OK, f"stream: {chosen.why}; everything goes through the engine's API "
        "(inputs copied into a volume; no pausing, no wheelhouse mount)",
    )  # fmt: skip


def network(given: str) -> Check:
    """The allowlist in force (SANDCELL_ALLOW_NET; --allow-net adds to it per command)."""
    from sandcell.sandbox.allowlist import Allowlist

    try:
        allowlist = Allowlist.parse(given.split())
    except ValueError as error:
        return Check("network", FAIL, f"SANDCELL_ALLOW_NET: {error}", "correct or unset it")
    if not allowlist:
        return Check("network", OK, "none: sandboxes have no network (--allow-net names hosts)")
    return Check("network", OK, f"named hosts only, through a proxy on this host: {allowlist}")


def checks(
    settings: ModelSettings,
    runtime: str | None,
    endpoint_given: bool = False,
    transport: str = "auto",
    cluster: str | None = None,
) -> Iterator[Check]:
    """Every check, in the order a person fixes them; with `cluster` (doctor --ray), the Ray
    cluster's nodes in place of this host's engine."""  # fmt: skip
    if cluster is not None:
        from sandcell.agent.cli.doctor_cluster import cluster_checks  # imports Ray: only here

        yield from cluster_checks(cluster, runtime)
        yield model(settings, dict(os.environ), endpoint_given)
        return
    client, found = engine()
    yield found
    info = None
    if client is None:
        for name in ("image", "runtime", "transport", "pausing", "cgroups"):
            yield Check(name, SKIP, "needs the engine")
        yield packages(None)
    else:
        try:
            info = client.info()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            yield Check(
                "engine", FAIL, f"the engine stopped answering ({error})", _engine_fix(error)
            )
            return
        yield image(client)
        yield packages(client)
        if is_podman(client):  # its API runs every container under its own runtime
            yield podman_runtime(runtime)
        else:
            yield runtimes(info, runtime)
        yield transports(client, transport)
        yield pausing(info) if not is_podman(client) else Check(
            "pausing", OK, "off: Podman keeps no checkpoint sandcell can use (sessions get a "
            "fresh kernel, or their cells replayed)",
        )  # fmt: skip
        yield cgroups(info)
    yield network(os.environ.get("SANDCELL_ALLOW_NET", ""))
    yield model(settings, dict(os.environ), endpoint_given)
    yield disk(info)
