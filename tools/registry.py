"""The tool registry: typed tools, argument checks, timeouts, a result cache, and the two
ways a model sees the tools (OpenAI `tools` entries and a ReAct prompt block)."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypedDict, TypeVar, Unpack

import json_repair
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

log = logging.getLogger(__name__)

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the OpenAI API accepts as a name
_CACHE_SIZE = 256


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A small thread-safe least-recently-used map: tool results, file profiles."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: K, value: V) -> V:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


@dataclass
class ToolOutcome:
    """What one tool call gave: whether it worked, the text the model reads, and its data
    (the python tool's Execution). agent.events.Observation publishes it."""

    ok: bool  # False when the call failed (bad args, unknown tool, tool error, timeout)
    text: str  # what the model sees
    data: object = None  # e.g. the sandbox Execution for the python tool


@dataclass(frozen=True)
class Spec:
    """What a model or an MCP client is told about a tool: its name, when to use it (and when
    not), and the JSON schema of its arguments. The one definition: every front end derives
    its own view of the tool from it (agent.mcp.definitions for MCP)."""

    name: str
    description: str
    parameters: dict  # JSON schema of the arguments (type object)


class ToolOptions(TypedDict, total=False):
    """Tool's optional fields, as Tool.of takes them."""

    timeout_s: float
    cacheable: bool
    raises: tuple[type[Exception], ...]


@dataclass
class Tool:
    name: str
    description: str  # says when to use it and when NOT to
    parameters: dict  # JSON schema of the arguments (type object)
    function: Callable[..., str | ToolOutcome]  # called with **args
    timeout_s: float = 30.0
    cacheable: bool = False  # deterministic: cache results by (name, args)
    # errors that end the question instead of becoming an observation (no sandbox at all)
    raises: tuple[type[Exception], ...] = ()

    @classmethod
    def of(
        cls, spec: Spec, function: Callable[..., str | ToolOutcome], **options: Unpack[ToolOptions]
    ) -> Tool:
        """The tool `spec` defines, run by `function` (options: timeout_s, cacheable, raises)."""
        return cls(spec.name, spec.description, spec.parameters, function, **options)

    @property
    def spec(self) -> Spec:
        return Spec(self.name, self.description, self.parameters)


class ToolError(Exception):
    """Raised by a tool function: its message becomes the observation (ok=False)."""


class Registry:
    def __init__(self, tools: Iterable[Tool]):
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, Draft202012Validator] = {}
        for tool in tools:
            if not _NAME_RE.match(tool.name):
                raise ValueError(f"tool name {tool.name!r} must match {_NAME_RE.pattern}")
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            if tool.parameters.get("type") != "object":
                raise ValueError(
                    f"tool {tool.name!r}: parameters must be a JSON schema of type object"
                )
            Draft202012Validator.check_schema(
                tool.parameters
            )  # a broken schema is a bug: fail early
            self._tools[tool.name] = tool
            self._validators[tool.name] = Draft202012Validator(tool.parameters)
        self._cache: LRU[tuple[str, str], ToolOutcome] = LRU(_CACHE_SIZE)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def openai_tools(self) -> list[dict]:
        return [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in self._tools.values()
        ]

    def react_block(self) -> str:
        blocks = []
        for t in self._tools.values():
            lines = [f"{t.name}: {t.description}", "  Action Input (a JSON object):"]
            props = t.parameters.get("properties", {})
            required = set(t.parameters.get("required", []))
            if not props:
                lines.append("    {} (no arguments)")
            for arg, schema in props.items():
                kind = _describe_type(schema)
                need = "required" if arg in required else "optional"
                desc = schema.get("description", "")
                lines.append(f"    {arg} ({kind}, {need}){': ' + desc if desc else ''}")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def call(self, name: str, args: dict | str | None) -> ToolOutcome:
        tool = self._tools.get(name)
        if tool is None:
            return ToolOutcome(
                False, f"unknown tool `{name}`; available tools: {', '.join(self.names)}"
            )
        parsed = _parse_args(tool, args)
        if isinstance(parsed, ToolOutcome):
            return parsed
        problem = self._check(tool, parsed)
        if problem:
            return ToolOutcome(False, f"{tool.name}: {problem}")
        key = None  # built only for cacheable tools: python calls carry whole cells
        if tool.cacheable:
            key = (name, json.dumps(parsed, sort_keys=True, ensure_ascii=False, default=str))
            hit = self._cache.get(key)
            if hit is not None:
                return hit
        outcome = _run_with_timeout(tool, parsed)
        # failures (timeouts above all) are not worth remembering
        if key is not None and outcome.ok:  # key: set for cacheable tools alone
            self._cache.put(key, outcome)
        return outcome

    def _check(self, tool: Tool, args: dict) -> str | None:
        return schema_problem(self._validators[tool.name], args)


def schema_problem(validator: Draft202012Validator, args: object) -> str | None:
    """What is wrong with args under the validator's schema, in words, or None. The validator
    is built once per schema: `jsonschema.validate` checks the schema itself on every call."""
    errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
    if not errors:
        return None
    return "; ".join(_explain(e, validator.schema) for e in errors[:3])


def _parse_args(tool: Tool, args: dict | str | None) -> dict | ToolOutcome:
    """Arguments arrive as a dict (native tool calls) or a JSON string (text protocols)."""
    if args is None:
        return {}
    if isinstance(args, dict):
        return args
    if not isinstance(args, str):
        return ToolOutcome(
            False, f"{tool.name}: arguments must be a JSON object, got {_json_type(args)}"
        )
    text = args.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        value = _repair(text)
        if value is None:
            only = single_string_arg(tool)
            if only and not text.startswith(("{", "[")):
                return {only: text}  # a ReAct model wrote `2+2` instead of {"expression": "2+2"}
            return ToolOutcome(
                False,
                f"{tool.name}: arguments are not valid JSON ({exc.msg} at line {exc.lineno} "
                f"column {exc.colno}) and could not be repaired; send one JSON object, "
                f"e.g. {example_args(tool)}",
            )
    if isinstance(value, dict):
        return value
    only = single_string_arg(tool)
    if only and not isinstance(value, (list, dict)):
        return {only: text}  # a bare value for a one-argument tool, e.g. "2+2" or 7
    return ToolOutcome(
        False,
        f"{tool.name}: arguments must be a JSON object, got {_json_type(value)}; e.g. {example_args(tool)}",
    )


def _repair(text: str) -> object | None:
    value = json_repair.repair_json(text, return_objects=True)
    # json_repair answers "" or {} when nothing in the text was an object; that is a failure,
    # not an empty argument list (otherwise `garbage {` would silently call with no args).
    if value == "" or (value == {} and re.sub(r"\s", "", text) not in ("{}", "{")):
        return None
    return value


def single_string_arg(tool: Tool) -> str | None:
    """The tool's one required string argument (what a bare input fills), or None."""
    required = tool.parameters.get("required", [])
    props = tool.parameters.get("properties", {})
    if len(required) == 1 and props.get(required[0], {}).get("type") == "string":
        return required[0]
    return None


def example_args(tool: Tool) -> str:
    """A JSON object of the tool's required arguments, each a placeholder of its type."""
    props = tool.parameters.get("properties", {})
    required = tool.parameters.get("required", []) or list(props)[:1]
    example = {arg: f"<{_describe_type(props.get(arg, {}))}>" for arg in required}
    return json.dumps(example, ensure_ascii=False)


# _json_type does the rest
_JSON_TYPES: dict[type, str] = {str: "string", list: "array", dict: "object"}


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _describe_type(schema: dict) -> str:
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if "enum" in schema:
        kind += " one of " + "/".join(json.dumps(v) for v in schema["enum"])
    return kind


def _explain(err: ValidationError, schema: dict) -> str:
    """A schema failure in words a model can act on: "`expression` must be a string, got number"."""
    where = ".".join(str(p) for p in err.absolute_path)
    arg = f"`{where}`" if where else "the arguments"
    if err.validator == "type":
        want = (
            err.validator_value
            if isinstance(err.validator_value, str)
            else " or ".join(err.validator_value)
        )
        article = "an" if want[0] in "aeiou" else "a"
        return f"{arg} must be {article} {want}, got {_json_type(err.instance)}"
    if err.validator == "required":
        missing = re.search(r"'([^']+)' is a required property", err.message)
        return f"missing required argument `{missing.group(1) if missing else err.message}`"
    if err.validator == "additionalProperties":
        allowed = ", ".join(f"`{p}`" for p in schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(schema.get("properties", {})))
        return f"unknown argument(s) {', '.join(f'`{e}`' for e in extra)}; allowed: {allowed}"
    if err.validator == "enum":
        options = ", ".join(json.dumps(v) for v in err.validator_value)
        return f"{arg} must be one of {options}, got {json.dumps(err.instance, default=str)}"
    return f"{arg}: {err.message}"


class _Box(TypedDict, total=False):
    """What the worker thread of _run_with_timeout hands back: a value or an error."""

    value: object
    error: BaseException


def _run_with_timeout(tool: Tool, args: dict) -> ToolOutcome:
    """Run in a worker thread so a slow tool cannot stall the agent past its timeout. A thread
    cannot be killed, so tools must bound their own work; this is the backstop."""
    box: _Box = {}

    def target() -> None:
        try:
            box["value"] = tool.function(**args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below, never dropped
            box["error"] = exc

    worker = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    worker.start()
    worker.join(tool.timeout_s)
    if worker.is_alive():
        return ToolOutcome(
            False,
            f"{tool.name} timed out after {tool.timeout_s:g} s; try a smaller input or a simpler request",
        )
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, tool.raises):
            raise exc
        if isinstance(exc, ToolError):
            return ToolOutcome(False, str(exc), data=exc)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not ours to swallow
            raise exc
        # Not a catch-all that hides a bug: the model and the trace see the exception's type and
        # message, the log gets the traceback, and ok=False counts toward the failure limit.
        log.error("tool %s failed", tool.name, exc_info=exc)
        return ToolOutcome(False, f"{tool.name} failed: {type(exc).__name__}: {exc}", data=exc)
    value = box.get("value")
    if isinstance(value, ToolOutcome):
        return value
    if isinstance(value, str):
        return ToolOutcome(True, value)
    raise TypeError(
        f"tool {tool.name} returned {type(value).__name__}; it must return str or ToolOutcome"
    )
