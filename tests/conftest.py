"""Shared fixtures. Docker tests skip outside CI when no engine or image is there (with the
reason printed); with CI=true a missing engine or image is a failure. The sandbox suites take
`runtime`, so each of their tests runs under runc and again under gVisor's runsc."""

import functools
import json
import os
import shutil
import subprocess
import sys

import pytest

from sandcell.sandbox.container import DEFAULT_IMAGE as IMAGE
from tests.missing import cannot_run


@functools.cache  # asked once per test process
def docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "the docker client is not installed (run `make engine`)"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "no Docker engine answers (run `make engine`)"
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"the sandbox image {IMAGE} is missing (run `sandcell image build`, or `make image` in a clone)"
    return None


RUNTIMES = ("runc", "runsc")


@functools.cache
def runtime_problem(runtime: str) -> str | None:
    probe = subprocess.run(
        ["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True
    )
    if probe.returncode == 0 and runtime not in json.loads(probe.stdout or "{}"):
        return f"the engine has no {runtime} runtime (run `make engine RUNTIME={runtime}`)"
    return None  # no engine at all: the docker marker says so


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request) -> str:
    """The OCI runtime a sandbox test runs under; runsc is skipped (failed in CI) when the
    engine does not have it."""
    problem = docker_problem() or runtime_problem(request.param)
    if problem is not None:
        cannot_run(problem, f"{request.param} test")
    return request.param


def forwarded(engine_socket: str):
    """DOCKER_HOST of an engine's socket reached over TCP on loopback, as a remote engine is
    (tests/tcp_engine.py, a process of its own, ended with the fixture)."""
    forwarder = subprocess.Popen(
        [sys.executable, "-m", "tests.tcp_engine"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, "SANDCELL_ENGINE_SOCKET": engine_socket},
    )  # fmt: skip
    assert forwarder.stdout is not None
    port = int(forwarder.stdout.readline())
    yield f"tcp://127.0.0.1:{port}"
    forwarder.kill()
    forwarder.wait()


@pytest.fixture(scope="session")
def tcp_engine():
    """The running Docker engine over TCP: one forwarder per test process."""
    yield from forwarded("/var/run/docker.sock")


PODMAN_SOCKET = "/run/podman/podman.sock"


@functools.cache
def podman_problem() -> str | None:
    """Why Podman's Docker API cannot be tested here (scripts/ensure-podman.sh starts it)."""
    import docker

    try:
        client = docker.DockerClient(base_url=f"unix://{PODMAN_SOCKET}", timeout=10)
        client.images.get(IMAGE)
    except Exception as error:  # any failure is the reason, said as it is
        return f"no Podman service with the sandbox image at {PODMAN_SOCKET} ({error}); run scripts/ensure-podman.sh"
    return None


@pytest.fixture(scope="session")
def podman_engine():
    """Podman's Docker-compatible API over TCP, as a Podman machine's is reached: `auto`
    takes the stream transport there."""
    problem = podman_problem()
    if problem is not None:
        cannot_run(problem, "Podman test")
    yield from forwarded(PODMAN_SOCKET)


TRANSPORTS = ("ipc", "stream", "podman")


@pytest.fixture(scope="module", params=TRANSPORTS)
def transport(request):
    """How the sandboxes of a module's test reach their engine: `ipc` on the local socket;
    `stream` over TCP (DOCKER_HOST set for the module: `auto` then picks stream, and every
    container, exec and file of the test goes through the engine's API alone); `podman`:
    Podman's Docker API over TCP, stream as well."""
    if request.param == "ipc":
        yield "ipc"
        return
    problem = docker_problem()
    if problem is not None:
        cannot_run(problem, "stream transport test")
    engine = "tcp_engine" if request.param == "stream" else "podman_engine"
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = FORWARDED[before] = request.getfixturevalue(engine)
    try:
        yield request.param
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before


FORWARDED: dict[str | None, str] = {}  # DOCKER_HOST as it was -> what `transport` set


@pytest.fixture(autouse=True)
def engine_of_its_own(request, monkeypatch):
    """A test of a module whose `transport` set DOCKER_HOST, but which does not take it
    itself, sees DOCKER_HOST as it was (the module's fixture lives on between its tests)."""
    if "transport" in request.fixturenames:
        return
    set_by_transport = {url: before for before, url in FORWARDED.items()}
    now = os.environ.get("DOCKER_HOST")
    if now in set_by_transport:
        before = set_by_transport[now]
        if before is None:
            monkeypatch.delenv("DOCKER_HOST")
        else:
            monkeypatch.setenv("DOCKER_HOST", before)


@pytest.hookimpl(tryfirst=True)  # before xdist names each test's group
def pytest_collection_modifyitems(items):
    """A test that takes the `browser` fixture (directly or through `page`) is marked
    `browser`, so `make unit` leaves it out. A grouped test's runsc twin gets a group of its
    own, so the two runtimes' groups run on different workers side by side instead of one
    after the other."""
    for item in items:
        if "browser" in getattr(
            item, "fixturenames", ()
        ):  # whatever the module: it drives Chromium
            item.add_marker(pytest.mark.browser)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("runtime") == "runsc" and item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("runsc"))


def pytest_runtest_setup(item):
    # Tests grouped with xdist_group must not run beside each other (one Ray cluster at a time,
    # one chat pty...): a pytest that drops xdist's group suffix spreads them over the workers
    # without a word (pytest-xdist#1386), and they fail later as flakes.
    if (
        getattr(item.config.option, "loadgroup", False)
        and item.get_closest_marker("xdist_group")
        and "@" not in item.nodeid
    ):
        pytest.fail(
            f"xdist --dist loadgroup is not grouping {item.nodeid} with this pytest "
            "(pytest-xdist#1386): install the pinned one (`make install`)",
            pytrace=False,
        )
    if item.get_closest_marker("docker") is None:
        return
    problem = docker_problem()
    if problem is None:
        return
    cannot_run(problem, "docker test")


@pytest.fixture(scope="session")
def image() -> str:
    return IMAGE
