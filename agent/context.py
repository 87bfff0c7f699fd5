"""The context budget: when the history grows past its budget, older figures are dropped
first (their file names stay), then older observations become one-line summaries. The system
prompt, every user question and the newest steps stay whole; message order and tool-call
pairing never change, so any endpoint accepts the result."""

from __future__ import annotations

from sandcell.agent.vision import IMAGE_CHARS, drop_images, image_count, text_of

COMPACTED = "[compacted]"


def size(messages: list[dict]) -> int:
    """Characters of the history, the unit of the budget (about 4 per token); an image counts
    as a fixed IMAGE_CHARS, whatever the length of its data URL."""
    total = 0
    for m in messages:
        total += len(text_of(m)) + IMAGE_CHARS * image_count(m)
        for call in m.get("tool_calls") or []:
            total += len(call["function"]["arguments"]) + len(call["function"]["name"])
    return total


def is_observation(message: dict) -> bool:
    role, content = message.get("role"), message.get("content") or ""
    return role == "tool" or (
        role == "user" and isinstance(content, str) and content.startswith("Observation:")
    )


def summarize(text: str, width: int = 160) -> str:
    """One line standing in for an observation: its error line if it failed, else its first
    line, and how much was dropped."""
    body = text.removeprefix("Observation:").strip()
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if "Error" in line.split(":")[0]), None)
    first = error or (lines[0] if lines else "(no output)")
    if len(first) > width:
        first = first[: width - 3] + "..."
    return f"{COMPACTED} {first} ({len(body)} chars, {len(lines)} lines)"


def fit(messages: list[dict], budget_chars: int, keep_recent: int = 3) -> int:
    """Compact older observations in place, oldest first, until the history fits or only the
    newest `keep_recent` steps are left whole. Returns how many were compacted."""
    if size(messages) <= budget_chars:
        return 0
    compacted = 0
    with_images = [m for m in messages if image_count(m)]
    for message in with_images[:-1]:  # oldest first; the newest figures stay
        compacted += bool(drop_images(message, f"{COMPACTED}: shown before, dropped"))
        if size(messages) <= budget_chars:
            return compacted
    steps = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    protected = steps[-keep_recent] if len(steps) >= keep_recent else 0
    for message in messages[:protected]:
        if not is_observation(message) or (message.get("content") or "").find(COMPACTED) >= 0:
            continue
        prefix = "Observation: " if message["role"] == "user" else ""
        message["content"] = prefix + summarize(message["content"])
        compacted += 1
        if size(messages) <= budget_chars:
            break
    if size(messages) > budget_chars:  # still too big: long old assistant texts are cut too
        for message in messages[:protected]:
            content = message.get("content") or ""
            if message.get("role") == "assistant" and len(content) > 600:
                message["content"] = content[:400] + f"\n{COMPACTED} {len(content) - 400} chars cut"
                compacted += 1
    return compacted
