"""Shared fixtures. Docker tests skip outside CI when no engine or image is there (with the
reason printed); with CI=true a missing engine or image is a failure. The sandbox suites take
`runtime`, so each of their tests runs under runc and again under gVisor's runsc."""

import functools
import json
import shutil
import subprocess

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
