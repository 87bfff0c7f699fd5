"""ScriptedModel: replays a file of replies, for demos and tests, with no endpoint at all.

The file is JSON (a list) or JSON Lines (one entry a line). An entry is a string (the reply's
text) or an object {"content": str, "tool_calls": [{"name": str, "arguments": object | str}],
"finish_reason": str}. In text mode (no tool definitions sent) tool calls are replayed as a
```json {"tool", "args"} block so the same script works with both protocols."""

from __future__ import annotations

import json
import time
from pathlib import Path

from agent.seams import ModelError, OnToken, Reply, ToolCall, estimated_usage


class ScriptedModel:
    def __init__(self, replies: list[str | dict] | str | Path, *, name: str | None = None):
        if isinstance(replies, (str, Path)):
            path = Path(replies)
            self.name = name or f"replay:{path.name}"
            replies = load_script(path)
        else:
            self.name = name or "replay"
        self.replies = [_entry(r) for r in replies]
        self.requests: list[dict] = []  # what the agent sent, for tests and demos

    def __repr__(self) -> str:
        return f"ScriptedModel({self.name!r}, {len(self.replies)} replies left)"

    def complete(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        tool_choice: str | None = None,
        stop: list[str] | None = None,
        on_token: OnToken | None = None,
    ) -> Reply:
        started = time.monotonic()
        self.requests.append(
            {"messages": list(messages), "tools": tools, "tool_choice": tool_choice, "stop": stop}
        )
        if not self.replies:
            raise ModelError(
                f"the scripted model {self.name} has no reply left after {len(self.requests) - 1}; "
                "add replies to the script, or use a real endpoint (OPENAI_BASE_URL)"
            )
        entry = self.replies.pop(0)
        text = entry["content"]
        n = len(self.requests)
        calls = [
            ToolCall(c.id or f"call_{n}_{i}", c.name, c.arguments)
            for i, c in enumerate(entry["tool_calls"])
        ]
        if calls and not tools:  # text protocol: the same call, written as a JSON block
            text += "".join(
                f'\n```json\n{{"tool": {json.dumps(c.name)}, "args": {c.arguments or "{}"}}}\n```'
                for c in calls
            )
            calls = []
        for s in stop or []:
            if s in text:
                text = text[: text.index(s)]
        if on_token:
            for i in range(0, len(text), 16):
                on_token(text[i : i + 16])
        finish = entry["finish_reason"] or ("tool_calls" if calls else "stop")
        usage = estimated_usage(messages, len(text))
        return Reply(text, calls, finish, usage, time.monotonic() - started)


def load_script(path: Path) -> list:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelError(f"cannot read the script of replies {path}: {exc.strerror}") from None
    try:
        if raw.lstrip().startswith("["):
            return json.loads(raw)
        return [json.loads(line) for line in raw.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ModelError(
            f"{path} is not a script of replies ({exc.msg}, line {exc.lineno}): write a JSON list, "
            "or one JSON string or object per line"
        ) from None


def _entry(raw: str | dict) -> dict:
    if isinstance(raw, str):
        return {"content": raw, "tool_calls": [], "finish_reason": None}
    calls = []
    for c in raw.get("tool_calls") or []:
        args = c.get("arguments", {})
        calls.append(
            ToolCall(
                c.get("id") or "", c["name"], args if isinstance(args, str) else json.dumps(args)
            )
        )
    return {
        "content": raw.get("content") or "",
        "tool_calls": calls,
        "finish_reason": raw.get("finish_reason"),
    }
