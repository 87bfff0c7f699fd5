"""Text ReAct parsing: one reply in, one action or a final answer out.

Accepted, in the order they appear in the reply (the earliest wins):
  Thought/Action/Action Input/Final Answer labels, also 思考/行动/行动输入/最终答案, with ASCII or
  full-width colons and markdown decoration (`**Action:**`);
  a ```python block (the python action); a ```json {"tool": ..., "args": ...} block (also
  {"name", "arguments"} and <tool_call> tags); a `tool_name(args)` call on its own line.
Whatever follows the action (an invented `Observation:`, a second action, an early final
answer) is cut off and returned as `cut`, never trusted. Arguments stay JSON text when the model
wrote JSON: the registry repairs it (json_repair) and explains what it cannot repair."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

import json_repair

from sandcell.agent.seams import Action, FormatError, Parsed

# After the colon only the markers that touch it (`**Final Answer:** x`): an answer that
# starts with Markdown emphasis (`Final Answer: **East**`) keeps it.
_LABEL = re.compile(
    r"^[ \t>*#_-]*(?P<label>final[ _]answer|action[ _]input|action|thought|observation|"
    r"最终答案|最终回答|行动输入|动作输入|行动|动作|思考|想法|观察结果|观察)[ \t*_]*[:：][*_]*[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
_KIND = {
    "final answer": "final", "最终答案": "final", "最终回答": "final",
    "action input": "input", "行动输入": "input", "动作输入": "input",
    "action": "action", "行动": "action", "动作": "action",
    "thought": "thought", "思考": "thought", "想法": "thought",
    "observation": "observation", "观察": "observation", "观察结果": "observation",
}  # fmt: skip
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)(?:^[ \t]*```[ \t]*$|\Z)",
    re.MULTILINE | re.DOTALL,
)
_TOOL_TAG = re.compile(r"<tool_call>\s*(?P<body>.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
THINK = re.compile(r"<think>(?P<body>.*?)</think>", re.DOTALL)
_TOOL_KEYS = ("tool", "name", "action", "tool_name", "function")
_ARG_KEYS = ("args", "arguments", "parameters", "action_input", "input", "tool_input")
_PYTHON_LANGS = ("python", "py", "python3", "ipython", "")
_WIDE = str.maketrans(
    {"｛": "{", "｝": "}", "：": ":", "，": ",", "“": '"', "”": '"', "（": "(", "）": ")"}
)

NO_ACTION = (
    "Your reply had no action and no final answer. To run code, send one ```python block; "
    "to use another tool, write `Action: <tool name>` and then `Action Input: <JSON object>`; "
    "when you know the answer, start a line with `Final Answer:`."
)


@dataclass
class _Hit:
    start: int
    end: int  # where the action ends; text after it is cut
    action: Action | None = None
    answer: str | None = None


def parse_react(text: str, tools: dict[str, str | None]) -> tuple[Parsed, str]:
    """Parse one text reply. `tools` maps each tool name to its single string parameter (the one
    a bare or fenced input fills), or None. Returns (parsed, cut text); raises FormatError."""
    thoughts = [m.group("body").strip() for m in THINK.finditer(text)]
    body = THINK.sub("", text)
    if "<think>" in body:  # an unclosed thinking block: the reply was cut inside it
        thoughts.append(body.split("<think>", 1)[1].strip())
        body = body.split("<think>", 1)[0]
    hits = [
        h for h in (_label_hit(body, tools), _block_hit(body, tools), _call_hit(body, tools)) if h
    ]
    if not hits:
        prose = _strip_labels(body).strip()
        raise FormatError(NO_ACTION if prose else "Your reply was empty. " + NO_ACTION, prose)
    hit = min(hits, key=lambda h: h.start)
    thought = "\n".join([*thoughts, _strip_labels(body[: hit.start]).strip()]).strip()
    if hit.answer is not None:
        return Parsed(thought=thought, answer=hit.answer), ""
    assert hit.action is not None  # every _Hit carries an answer or an action
    return Parsed(thought=thought, actions=[hit.action]), body[hit.end :].strip()


def _label_hit(body: str, tools: dict[str, str | None]) -> _Hit | None:
    labels = [(m, _KIND[m.group("label").lower().replace("_", " ")]) for m in _LABEL.finditer(body)]
    for i, (m, kind) in enumerate(labels):
        if kind == "final":
            end = next(
                (n.start() for n, k in labels[i + 1 :] if k in ("action", "observation")), len(body)
            )
            return _Hit(m.start(), end, answer=body[m.end() : end].strip())
        if kind != "action":
            continue
        line_end = body.find("\n", m.end())
        line_end = len(body) if line_end < 0 else line_end
        name_text = body[m.end() : line_end].strip().strip("`*").strip()
        rest = labels[i + 1 :]
        stop = next((n.start() for n, k in rest if k not in ("input",)), len(body))
        found = None
        if "(" in name_text or "（" in name_text:
            found = _parse_call(name_text, tools) or _parse_call(
                body[m.end() : stop].strip().strip("`"), tools
            )
        if found is not None:
            return _Hit(m.start(), stop, found[0])
        name = name_text.split()[0].strip("`*[]:：") if name_text else ""
        inp = next(((n, k) for n, k in rest if k == "input"), None)
        if inp is not None:
            after = [n.start() for n, k in rest if n.start() > inp[0].start()]
            end = after[0] if after else len(body)
            raw = body[inp[0].end() : end]
        else:  # no Action Input label: the first code block after the Action line, if any
            fence = _FENCE.search(body, line_end)
            if fence is None or fence.start() > stop:
                raise FormatError(
                    f"`Action: {name or '?'}` had no `Action Input:`. Write the arguments on the "
                    'next line as `Action Input: {"<argument>": <value>}`.'
                )
            end, raw = fence.end(), fence.group(0)
        return _Hit(m.start(), end, Action(name, _input(raw, tools.get(name)), how="label"))
    return None


def _block_hit(body: str, tools: dict[str, str | None]) -> _Hit | None:
    for m in [*_FENCE.finditer(body), *_TOOL_TAG.finditer(body)]:
        inner = m.group("body")
        lang = (m.groupdict().get("lang") or "").lower()
        if lang in ("json", "tool_call", "") or m.re is _TOOL_TAG:
            action = _json_action(inner)
            if action is not None:
                return _Hit(m.start(), m.end(), action)
        code_block = (
            lang in _PYTHON_LANGS and m.re is _FENCE and "python" in tools and inner.strip()
        )
        if code_block and (lang or not _looks_like_output(inner)):
            return _Hit(
                m.start(), m.end(), Action("python", {"code": inner.rstrip()}, how="python_block")
            )
    return None


def _json_action(inner: str) -> Action | None:
    text = inner.strip()
    if not text.startswith(("{", "｛")):
        return None
    value = json_repair.repair_json(
        text.translate(_WIDE) if "｛" in text else text, return_objects=True
    )
    if not isinstance(value, dict):
        return None
    name = next((value[k] for k in _TOOL_KEYS if isinstance(value.get(k), str)), None)
    if name is None:
        return None
    args: object = next((value[k] for k in _ARG_KEYS if k in value), {})
    return Action(
        name, args if isinstance(args, (dict, str)) else json.dumps(args), how="json_block"
    )


def _call_hit(body: str, tools: dict[str, str | None]) -> _Hit | None:
    if not tools:
        return None
    names = "|".join(re.escape(n) for n in tools)
    fences = [(m.start(), m.end()) for m in _FENCE.finditer(body)]
    for m in re.finditer(rf"^[ \t`]*(?P<call>(?:{names})\s*[(（])", body, re.MULTILINE):
        if any(a <= m.start() < b for a, b in fences):
            continue
        found = _parse_call(body[m.start("call") :], tools)
        if found is not None:
            return _Hit(m.start(), m.start("call") + found[1], found[0])
    return None


def _parse_call(text: str, tools: dict[str, str | None]) -> tuple[Action, int] | None:
    """`name(args)` with keyword arguments, one positional value, a dict, or raw text inside.
    Returns the action and the length of the call in `text`."""
    m = re.match(r"(?P<name>[\w-]+)\s*[(（]", text)
    if m is None or m.group("name") not in tools:
        return None
    name, param = m.group("name"), tools[m.group("name")]
    closes = [i for i, ch in enumerate(text[:20_000]) if ch in ")）"]
    for close in closes:  # the shortest span that is a Python call
        src = text[: close + 1].translate(_WIDE)
        try:
            node = ast.parse(src, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = _call_args(node, src, param)
            if args is not None:
                return Action(name, args, how="call"), close + 1
        break
    if not closes or closes[-1] <= m.end():
        return None
    close = next((c for c in closes if "\n" not in text[m.end() : c]), closes[-1])
    raw = text[m.end() : close].strip()
    call_args = raw if raw.startswith(("{", "｛")) or not param else {param: _unquote(raw)}
    return Action(name, call_args, how="call"), close + 1


def _call_args(node: ast.Call, src: str, param: str | None) -> dict | None:
    try:
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
        if not node.args:
            return kwargs
        if len(node.args) == 1 and not kwargs:
            arg = node.args[0]
            if isinstance(arg, ast.Dict):
                value = ast.literal_eval(arg)
                return value if isinstance(value, dict) else None
            try:
                value = ast.literal_eval(arg)
            except ValueError:
                value = ast.get_source_segment(src, arg)  # calculator(2*3): the text inside
            return {param: value if isinstance(value, str) else str(value)} if param else None
    except ValueError:
        return None
    return None


def _input(raw: str, param: str | None) -> dict | str:
    """Action Input text -> arguments. JSON stays text (the registry repairs and checks it); a
    fenced or bare value fills the tool's single string parameter."""
    text = raw.strip()
    fence = _FENCE.match(text)
    if fence:
        if fence.group("lang").lower() != "json" and param:
            return {param: fence.group("body").rstrip()}
        text = fence.group("body").strip()
    if text.startswith(("{", "｛")):
        wide = text.translate(_WIDE) if "｛" in text else text
        value = json_repair.repair_json(wide, return_objects=True)
        if isinstance(value, dict) and value or not param:
            return wide
        return {param: text}  # code that starts with a brace, e.g. a dict literal
    return {param: _unquote(text)} if param else text


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        return text[1:-1]
    return text


def _looks_like_output(inner: str) -> bool:
    """An untagged block of numbers or a table is output the model quoted, not code to run."""
    return not re.search(r"[=(]|^\s*(import|from|print|for|if|def)\b", inner, re.MULTILINE)


def _strip_labels(text: str) -> str:
    return _LABEL.sub("", text)
