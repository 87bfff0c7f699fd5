"""The observation the model sees of one Execution: bounded text, never the raw stream."""

from sandbox.boundary import ERROR_KEY
from sandbox.execution import Execution

IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")


def cut(text: str, budget: int, saved: str | None = None) -> str:
    """Head + tail of text within budget, with a marker saying how much was cut and where
    the full text is."""
    if len(text) <= budget:
        return text
    where = f"; full output saved to {saved}" if saved else ""
    marker = "\n[... {n} characters cut" + where + " ...]\n"
    room = max(0, budget - len(marker) - 8)
    head, tail = text[: room * 2 // 3], text[len(text) - room // 3 :] if room // 3 else ""
    return head + marker.format(n=len(text) - len(head) - len(tail)) + tail


def render(execution: Execution, budget: int = 4000) -> str:
    parts: list[str] = []
    stream = "".join(c.text for c in execution.stream)
    if stream:
        parts.append(cut(stream, budget * 3 // 5, execution.saved_output))
    for result in execution.results:
        parts.append(_result(result, budget // 3))
    if execution.error is not None:
        err = execution.error
        trace = "\n".join(line for line in err.traceback[:-1] if line.strip())
        parts.append(cut(f"{trace}\n{err.name}: {err.value}".strip(), budget // 3))
    if execution.dropped_bytes and not execution.saved_output:
        parts.append(f"[{execution.dropped_bytes} bytes of output were dropped by the sandbox]")
    if execution.restarted:
        parts.append(_restart_note(execution))
    elif execution.timed_out:
        parts.append(
            f"[Timed out after {execution.duration_s:.0f} s: the cell was interrupted; "
            "variables are kept. Make the code faster or work on a sample.]"
        )
    text = "\n".join(p.rstrip("\n") for p in parts if p)
    return cut(text, budget) if text else "[ran without output]"


def _result(result, budget: int) -> str:
    image = next((t for t in IMAGE_TYPES if t in result.data), None)
    if image:
        where = result.path or result.metadata.get(ERROR_KEY, "not saved")
        return f"[image {image} saved to {where}]"
    text = result.data.get("text/plain")
    if text is None:
        kinds = ", ".join(sorted(result.data)) or "nothing"
        return f"[display of {kinds}]"
    return cut(text, budget)


def _restart_note(execution: Execution) -> str:
    why = {
        "timeout": "it did not stop after the timeout and an interrupt",
        "out of memory": "it ran out of memory (use less: read fewer columns, chunksize=...)",
        "died": "the kernel process died",
    }.get(execution.restarted, execution.restarted)
    return (
        f"[The kernel was restarted because {why}. All variables are lost; files in "
        "/workspace are kept. Re-run what you need.]"
    )
