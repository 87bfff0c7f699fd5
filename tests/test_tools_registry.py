"""The registry: argument parsing and repair, schema errors in words, timeouts, the cache, and
both renderings of the tool list; plus `sandcell tool` run in-process with click's CliRunner."""

import json
import threading
import time

import pytest
from click.testing import CliRunner

from sandcell.agent.cli import main
from sandcell.sandbox import BackgroundSandbox, Inputs, Limits, Sandbox
from sandcell.tools import (
    Registry,
    Tool,
    ToolError,
    ToolOutcome,
    calculator,
    calculator_tool,
    file_metadata,
    file_metadata_tool,
    python,
    python_tool,
)


def _echo_tool(**kw) -> Tool:
    schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "description": "what to echo"},
            "times": {"type": "integer"},
        },
        "required": ["text"],
        "additionalProperties": False,
    }
    return Tool(
        "echo",
        "Echo text. Do NOT use for anything else.",
        schema,
        lambda text, times=1: text * times,
        **kw,
    )


def test_dict_and_json_string_args():
    reg = Registry([_echo_tool()])
    assert reg.call("echo", {"text": "ab", "times": 2}) == ToolOutcome(True, "abab")
    assert reg.call("echo", '{"text": "ab", "times": 3}').text == "ababab"


def test_broken_json_is_repaired():
    reg = Registry([_echo_tool()])
    assert reg.call("echo", '{"text": "hi", "times": 2').text == "hihi"  # missing brace
    assert reg.call("echo", "{'text': 'hi',}").text == "hi"  # single quotes, trailing comma


def test_unrepairable_json_says_what_is_wrong():
    reg = Registry(
        [
            Tool(
                "two",
                "d",
                {
                    "type": "object",
                    "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                    "required": ["a", "b"],
                },
                lambda a, b: a + b,
            )
        ]
    )
    obs = reg.call("two", "garbage {")
    assert not obs.ok
    assert (
        "not valid JSON" in obs.text and "could not be repaired" in obs.text and '"a"' in obs.text
    )
    obs = reg.call("two", "[1, 2]")
    assert not obs.ok and "must be a JSON object, got array" in obs.text


def test_bare_text_for_a_one_string_argument_tool():
    reg = Registry([calculator_tool])
    assert reg.call("calculator", "2+3*4").text == "14"


def test_unknown_tool_lists_real_names():
    obs = Registry([_echo_tool(), calculator_tool]).call("calc", {})
    assert not obs.ok and "unknown tool `calc`" in obs.text and "echo, calculator" in obs.text


def test_schema_errors_read_like_sentences():
    reg = Registry([calculator_tool, _echo_tool()])
    obs = reg.call("calculator", {"expression": 1})
    assert not obs.ok and "`expression` must be a string, got number" in obs.text
    assert "missing required argument `text`" in reg.call("echo", {}).text
    assert "unknown argument(s) `colour`" in reg.call("echo", {"text": "a", "colour": 1}).text
    assert (
        "`times` must be an integer, got string"
        in reg.call("echo", {"text": "a", "times": "2"}).text
    )


def test_tool_error_and_unexpected_exception():
    def fails(kind: str) -> str:
        if kind == "tool":
            raise ToolError("the file is gone; list /data first")
        return {}["missing"]

    schema = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}
    reg = Registry([Tool("f", "d", schema, fails)])
    assert reg.call("f", {"kind": "tool"}).text == "the file is gone; list /data first"
    obs = reg.call("f", {"kind": "bug"})
    assert (
        not obs.ok
        and obs.text == "f failed: KeyError: 'missing'"
        and isinstance(obs.data, KeyError)
    )


@pytest.mark.timeout(10)
def test_timeout_returns_promptly():
    release = threading.Event()
    schema = {"type": "object", "properties": {}}
    reg = Registry([Tool("slow", "d", schema, lambda: release.wait(5) and "late", timeout_s=0.2)])
    start = time.perf_counter()
    obs = reg.call("slow", {})
    release.set()
    assert time.perf_counter() - start < 1.5
    assert not obs.ok and "timed out after 0.2 s" in obs.text


def test_cache_only_for_cacheable_tools_and_only_successes():
    calls = []

    def count(n: int) -> str:
        calls.append(n)
        if n < 0:
            raise ToolError("negative")
        return str(n)

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    reg = Registry([Tool("c", "d", schema, count, cacheable=True), Tool("u", "d", schema, count)])
    for _ in range(3):
        assert reg.call("c", {"n": 1}).text == "1"
        assert reg.call("c", '{"n": 1}').text == "1"
        reg.call("c", {"n": -1})
        reg.call("u", {"n": 2})
    assert calls == [1, -1, 2, -1, 2, -1, 2]  # 1 computed once; the error and "u" every time


def test_openai_and_react_renderings():
    reg = Registry([calculator_tool, _echo_tool()])
    entries = reg.openai_tools()
    assert [e["function"]["name"] for e in entries] == ["calculator", "echo"]
    assert entries[0]["type"] == "function" and entries[0]["function"]["parameters"][
        "required"
    ] == ["expression"]
    json.dumps(entries)  # what the openai client sends must be plain JSON
    block = reg.react_block()
    assert "calculator: Exact arithmetic" in block and "Not for data in files" in block
    assert "text (string, required): what to echo" in block and "times (integer, optional)" in block


def never_started() -> Sandbox:
    raise AssertionError("only the tools' definitions are read: no sandbox is needed")


def test_each_agent_tool_is_its_one_definition_in_both_renderings():
    """The agent's tools are their modules' SPECs (the MCP server lists the same ones), and a
    model sees each argument's words in both renderings."""
    sandbox = BackgroundSandbox(never_started, Limits(), Inputs.from_paths([]), background=False)
    agent = [python_tool(sandbox), file_metadata_tool(), calculator_tool]
    assert [tool.spec for tool in agent] == [python.SPEC, file_metadata.SPEC, calculator.SPEC]
    reg = Registry(agent)
    for entry, tool in zip(reg.openai_tools(), agent, strict=True):
        assert entry["function"] == {
            "name": tool.spec.name,
            "description": tool.spec.description,
            "parameters": tool.spec.parameters,
        }
    block = reg.react_block()
    assert "code (string, required): Python source for one cell" in block
    assert "path (string, required): /data/<name> or a /workspace path" in block


def test_registry_rejects_bad_definitions():
    with pytest.raises(ValueError, match="two tools"):
        Registry([_echo_tool(), _echo_tool()])
    with pytest.raises(ValueError, match="must match"):
        Registry([Tool("bad name", "d", {"type": "object"}, lambda: "")])
    with pytest.raises(ValueError, match="type object"):
        Registry([Tool("x", "d", {"type": "string"}, lambda: "")])


def test_a_tool_returning_the_wrong_type_is_a_bug_not_an_observation():
    reg = Registry([Tool("x", "d", {"type": "object"}, lambda: 42)])
    with pytest.raises(TypeError, match="must return str or ToolOutcome"):
        reg.call("x", {})


def _cli(*args: str):
    return CliRunner().invoke(main, ["tool", *args])  # in-process: no sandbox involved


def test_cli_runs_one_tool(tmp_path):
    ok = _cli("calculator", '{"expression": "1,234.5 × 2"}')
    assert ok.exit_code == 0 and ok.stdout == "2469.0\n"
    bad = _cli("calculator", '{"expression": "10**10**10"}')
    assert bad.exit_code == 1 and bad.stderr.startswith("error: ") and "digits" in bad.stderr
    assert bad.stdout == ""
    data = tmp_path / "sales.csv"
    data.write_text("region,amount\nnorth,10\nsouth,\n")
    meta = _cli("file_metadata", '{"path": "/data/sales.csv"}', "--input", str(data))
    assert meta.exit_code == 0, meta.stderr
    assert "2 rows x 2 columns" in meta.stdout and "amount: int, 1 null" in meta.stdout
    out = _cli("file_metadata", '{"path": "/etc/passwd"}', "--input", str(data))
    assert out.exit_code == 1 and "outside the sandbox" in out.stderr


def test_cli_parses_a_person_s_json_strictly():
    """The repair that suits a model's output would read `{bad` as ["bad"]: on the command
    line a broken object is a usage error saying where it broke (the registry still repairs)."""
    broken = _cli("calculator", "{bad")
    assert broken.exit_code == 2 and broken.stdout == ""
    assert (
        "'{bad' is not valid JSON: Expecting property name enclosed in double quotes at "
        "line 1 column 2" in broken.stderr
    )
    assert "array" not in broken.stderr and '{"expression": "<string>"}' in broken.stderr
    unclosed = _cli("calculator", '{"expression": "2+2"')
    assert unclosed.exit_code == 2 and "is not valid JSON" in unclosed.stderr
    listed = _cli("calculator", "[1]")
    assert listed.exit_code == 2 and "'[1]' is JSON but not an object" in listed.stderr
    assert Registry([calculator_tool]).call("calculator", '{"expression": "2+2"').text == "4"
