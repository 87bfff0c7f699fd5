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


def kill_after_results(proc, results, count: int, seconds: float) -> dict[str, str]:
    """SIGKILL a batch's process once its results.jsonl holds `count` lines (a batch killed
    midway); the lines written by then, by job id."""
    import json
    import os
    import signal

    wait_for(lambda: lines_in(results) >= count, seconds, f"{count} finished jobs")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return {json.loads(line)["id"]: line for line in results.read_text().splitlines()}
