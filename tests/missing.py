"""A part a test needs that is not here (Docker, gVisor, Chromium, the llama.cpp server): the
test skips with the reason outside CI, and fails in CI (CI=true), where every part must be."""

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cannot_run(problem: str, what: str = "test") -> None:
    """Fail (CI) or skip (elsewhere) the running test, saying what is missing."""
    if IN_CI:
        pytest.fail(f"CI=true but {problem}", pytrace=False)
    pytest.skip(f"{what} skipped: {problem}")
