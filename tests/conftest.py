"""Shared fixtures. Docker tests skip outside CI when no engine or image is there (with the
reason printed); with CI=true a missing engine or image is a failure."""

import functools
import os
import shutil
import subprocess

import pytest

from sandbox.container import DEFAULT_IMAGE as IMAGE

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@functools.cache  # asked once per test process
def docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "the docker client is not installed (run `make engine`)"
    probe = subprocess.run(["docker", "info"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "no Docker engine answers (run `make engine`)"
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"the sandbox image {IMAGE} is missing (run `make image`)"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("docker") is None:
        return
    problem = docker_problem()
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true but {problem}", pytrace=False)
    pytest.skip(f"docker test skipped: {problem}")


@pytest.fixture(scope="session")
def image() -> str:
    return IMAGE
