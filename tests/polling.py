"""Waiting in tests for something another process or thread makes true."""

import time


def wait_for(predicate, seconds: float = 60, what: str = "the condition") -> None:
    """Return once predicate() is true; AssertionError naming WHAT after SECONDS."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")


def lines_in(path) -> int:
    """Lines of a file that may not be there yet (results.jsonl as jobs finish)."""
    return len(path.read_text().splitlines()) if path.exists() else 0
