"""ScriptedModel: replays a file of replies, for demos and tests, with no endpoint at all.

The file is JSON (a list) or JSON Lines (one entry a line). An entry is a string (the reply's
text) or an object {"content": str, "tool_calls": [{"name": str, "arguments": object | str}],
"finish_reason": str}. In text mode (no tool definitions sent) tool calls are replayed as a
```json {"tool", "args"} block so the same script works with both protocols.

Every entry is checked when the script is loaded: a bad one is a ScriptError (a usage error,
exit 2) naming the file, the entry (and its line in JSON Lines) and the key at fault."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from sandcell.agent.seams import (
    ModelAttempt,
    ModelError,
    OnAttempt,
    OnToken,
    Reply,
    ToolCall,
    estimated_usage,
)
from sandcell.sandbox.inputs import InputError

_FORMAT = (
    'an entry is a string (the reply\'s text) or {"content": str, "tool_calls": [{"name": str, '
    '"arguments": object | str, "id": str}], "finish_reason": str}'
)
_KEYS = ("content", "tool_calls", "finish_reason")
_CALL_KEYS = ("name", "arguments", "id")


class ScriptError(InputError):
    """A script of replies cannot be used (unreadable, not JSON, an entry of the wrong shape):
    a usage error, as a bad --input is; the message names the file, the entry and the key."""


class ScriptedModel:
    def __init__(self, replies: list[str | dict] | str | Path, *, name: str | None = None):
        if isinstance(replies, (str, Path)):
            path = Path(replies)
            self.name = name or f"replay:{path.name}"
            numbered = load_script(path)
        else:
            self.name = name or "replay"
            numbered = [(None, r) for r in replies]
            path = None
        where = str(path) if path else "the script of replies"
        self.replies = [_entry(r, where, n, line) for n, (line, r) in enumerate(numbered, 1)]
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
        deadline: float | None = None,  # replies are instant here
        cancelled: Callable[[], bool] | None = None,
        on_attempt: OnAttempt | None = None,
    ) -> Reply:
        started, sent = time.monotonic(), time.time()
        self.requests.append(
            {"messages": list(messages), "tools": tools, "tool_choice": tool_choice, "stop": stop}
        )
        if not self.replies:
            error = ModelError(
                f"the scripted model {self.name} has no reply left after {len(self.requests) - 1}; "
                "add replies to the script, or use a real endpoint (OPENAI_BASE_URL)"
            )
            if on_attempt is not None:
                on_attempt(ModelAttempt.failed(sent, started, 0, error))
            raise error
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
        took = time.monotonic() - started
        if on_attempt is not None:
            on_attempt(ModelAttempt(sent, took, 0, None, usage, finish))
        return Reply(text, calls, finish, usage, took)


def load_script(path: Path) -> list[tuple[int | None, object]]:
    """The entries of a script file, each with its line number (None in a JSON list)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "it is not UTF-8 text"
        raise ScriptError(f"cannot read the script of replies {path}: {why}") from None
    entries: list[tuple[int | None, object]]
    try:
        if raw.lstrip().startswith("["):
            entries = [(None, e) for e in json.loads(raw)]
        else:
            entries = [
                (number, json.loads(line))
                for number, line in enumerate(raw.splitlines(), 1)
                if line.strip()
            ]
    except json.JSONDecodeError as exc:
        raise ScriptError(
            f"{path} is not a script of replies ({exc.msg}, line {exc.lineno}): write a JSON list, "
            "or one JSON string or object per line"
        ) from None
    if not entries:
        raise ScriptError(f"{path} holds no replies: {_FORMAT}")
    return entries


def _entry(raw: object, where: str, number: int, line: int | None) -> dict:
    """One entry checked and put in the form complete() replays."""
    at = f"{where}:{line}: entry {number}" if line else f"{where}: entry {number}"

    def bad(what: str) -> ScriptError:
        joined = f"{at} {what}" if what.startswith(("is ", "has ")) else f"{at}: {what}"
        return ScriptError(f"{joined}; {_FORMAT}")

    if isinstance(raw, str):
        return {"content": raw, "tool_calls": [], "finish_reason": None}
    if not isinstance(raw, dict):
        raise bad(f"is {_shown(raw)}, not a string or an object")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise bad(f"has an unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        raise bad(f'"content" must be a string, not {_shown(content)}')
    finish = raw.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise bad(f'"finish_reason" must be a string, not {_shown(finish)}')
    raw_calls = raw.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise bad(
            f'"tool_calls" must be a list of {{"name", "arguments"}} objects, not {_shown(raw_calls)}'
        )
    calls = []
    for i, c in enumerate(raw_calls, 1):
        if not isinstance(c, dict):
            raise bad(f'tool call {i} is {_shown(c)}, not a {{"name", "arguments"}} object')
        unknown = sorted(set(c) - set(_CALL_KEYS))
        if unknown:
            raise bad(
                f"tool call {i} has an unknown key {unknown[0]!r} (known: name, arguments, id)"
            )
        if "name" not in c:
            raise bad(f'tool call {i} has no "name"')
        if not isinstance(c["name"], str) or not c["name"]:
            raise bad(f'tool call {i}: "name" must be a tool\'s name, not {_shown(c["name"])}')
        args = c.get("arguments", {})
        if not isinstance(args, (dict, str)):
            raise bad(
                f'tool call {i}: "arguments" must be an object or a JSON string, not {_shown(args)}'
            )
        call_id = c.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise bad(f'tool call {i}: "id" must be a string, not {_shown(call_id)}')
        calls.append(
            ToolCall(call_id or "", c["name"], args if isinstance(args, str) else json.dumps(args))
        )
    return {"content": content or "", "tool_calls": calls, "finish_reason": finish}


def _shown(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."
