"""The two action protocols: how tools are offered to the model, how a reply becomes actions,
and how actions and observations are written back into the conversation.

`tools`: native tool calls (the `tools` request parameter, answers carry `tool_call_id`).
`react`: plain text parsed by agent.parsing. `auto` starts with `tools` and the loop falls back
to `react` when the endpoint refuses tool definitions (ToolsUnsupported)."""

from __future__ import annotations

import json
from typing import Protocol

import json_repair

from sandcell.agent.parsing import THINK, parse_react
from sandcell.agent.seams import Action, FormatError, Parsed, Reply
from sandcell.tools import Registry
from sandcell.tools.registry import single_string_arg

# Stop sequences for text mode: the model must not write the observation itself.
REACT_STOP = ["\nObservation:", "\nObservation：", "\n观察:", "\n观察："]

REACT_FORMAT = """Answer in this format, one action per reply:

Thought: what you will do next and why
Action: the tool name, one of [{names}]
Action Input: the tool's arguments as one JSON object

To run Python you may instead write one ```python code block after your thought.
Then stop: the Observation (the tool's result) is written for you in the next message.
When you know the answer, reply with:

Thought: why the answer is complete
Final Answer: the answer for the user

Tools:

{tools}"""


class ActionProtocol(Protocol):
    name: str

    def request(self, registry: Registry) -> dict: ...
    def instructions(self, registry: Registry) -> str: ...
    def parse(self, reply: Reply, registry: Registry) -> tuple[Parsed, str]: ...
    def assistant_message(self, reply: Reply, cut: str) -> dict: ...
    def observation_messages(self, actions: list[Action], texts: list[str]) -> list[dict]: ...


def single_string_params(registry: Registry) -> dict[str, str | None]:
    """Each tool's one required string argument (what a bare or fenced input fills), or None."""
    return {
        name: single_string_arg(tool)
        for name in registry.names
        if (tool := registry.get(name)) is not None  # always: the names are the registry's
    }


class ReactProtocol:
    name = "react"

    def request(self, registry: Registry) -> dict:
        return {"tools": None, "stop": REACT_STOP}

    def instructions(self, registry: Registry) -> str:
        return REACT_FORMAT.format(names=", ".join(registry.names), tools=registry.react_block())

    def parse(self, reply: Reply, registry: Registry) -> tuple[Parsed, str]:
        return parse_react(reply.text, single_string_params(registry))

    def assistant_message(self, reply: Reply, cut: str) -> dict:
        return {"role": "assistant", "content": _history_text(reply.text, cut)}

    def observation_messages(self, actions: list[Action], texts: list[str]) -> list[dict]:
        return [{"role": "user", "content": f"Observation: {text}"} for text in texts]


class ToolsProtocol:
    name = "tools"

    def request(self, registry: Registry) -> dict:
        return {"tools": registry.openai_tools(), "stop": None}

    def instructions(self, registry: Registry) -> str:
        return "Use the tools through tool calls. When you know the answer, reply with it as plain text."

    def parse(self, reply: Reply, registry: Registry) -> tuple[Parsed, str]:
        if reply.tool_calls:
            actions = [Action(c.name, c.arguments, call_id=c.id) for c in reply.tool_calls]
            return Parsed(thought=reply.text.strip(), actions=actions), ""
        # No tool call. Some models still write the action as text (a ```python block, a JSON
        # block, <tool_call> tags): run it rather than take it for the answer.
        try:
            parsed, cut = parse_react(reply.text, single_string_params(registry))
        except FormatError:
            return Parsed(answer=reply.text.strip()), ""
        if parsed.answer is not None or not parsed.actions:
            return Parsed(thought=parsed.thought, answer=parsed.answer or reply.text.strip()), ""
        if (
            parsed.actions[0].how == "python_block"
            and cut
            and not cut.lower().startswith("observation")
        ):
            return Parsed(answer=reply.text.strip()), ""  # code shown inside an answer, not run
        return parsed, cut

    def assistant_message(self, reply: Reply, cut: str) -> dict:
        if not reply.tool_calls:
            return {"role": "assistant", "content": _history_text(reply.text, cut)}
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _valid_json(c.arguments)},
            }
            for c in reply.tool_calls
        ]
        return {
            "role": "assistant",
            "content": _history_text(reply.text, "") or None,
            "tool_calls": calls,
        }

    def observation_messages(self, actions: list[Action], texts: list[str]) -> list[dict]:
        return [
            {"role": "tool", "tool_call_id": a.call_id, "content": text}
            if a.call_id
            else {"role": "user", "content": f"Observation: {text}"}
            for a, text in zip(actions, texts, strict=True)
        ]


def answer_from_text(text: str, registry: Registry) -> str | None:
    """The answer in a reply to the forced-answer request: after `Final Answer:` if labelled,
    else the reply's prose (an action written anyway is dropped)."""
    try:
        parsed, _ = ReactProtocol().parse(Reply(text), registry)
    except FormatError as exc:
        return exc.text or None
    return (parsed.answer if parsed.answer is not None else parsed.thought) or None


def make_protocol(name: str) -> ActionProtocol:
    if name in ("tools", "auto"):
        return ToolsProtocol()
    if name == "react":
        return ReactProtocol()
    raise ValueError(f"unknown protocol {name!r}: use auto, tools or react")


def _history_text(text: str, cut: str) -> str:
    """The reply as it stays in the history: without thinking blocks, and without what followed
    the action (an invented observation is never trusted)."""
    text = THINK.sub("", text).strip()
    if cut and text.endswith(cut):
        return text[: -len(cut)].rstrip()
    return text


def _valid_json(arguments: str) -> str:
    """Servers may refuse a history whose tool-call arguments are not JSON: store them repaired."""
    try:
        json.loads(arguments)
        return arguments
    except json.JSONDecodeError:
        value = json_repair.repair_json(arguments, return_objects=True)
        return json.dumps(value if isinstance(value, dict) else {}, ensure_ascii=False)
