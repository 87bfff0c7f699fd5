"""What an MCP client is told about each tool (name, description, input and output schema),
written once. The three tools the agent has too are the agent's own definitions (the `SPEC`s
in tools/), under the names MCP clients know them by, with what MCP adds said here; the file
tools exist only here. The server (agent.mcp.server) lists and checks these, nothing else."""

from __future__ import annotations

import copy
import re

from mcp import types

from sandcell.sandbox import Limits
from sandcell.tools import calculator, file_metadata, python
from sandcell.tools.registry import Spec

READ_DEFAULT, READ_MAX = 64 << 10, 1 << 20  # read_file: bytes by default, and at most

# The MCP name of each agent tool the server offers (the README and clients use these names)
MCP_NAMES = {"python": "run_python", "file_metadata": "describe_file", "calculator": "calculator"}
_AGENT_NAME = re.compile(r"\b(" + "|".join(MCP_NAMES) + r")\b")  # `run_python` is one word

# What is true over MCP only: a session's kernel outlives a call, and figures are content
PYTHON_NOTE = (
    "Variables persist between calls; each figure comes back as PNG image content, and the data "
    "behind each chart and DataFrame shown as structuredContent {charts: [...], tables: [...]}."
)

_DICT_OUTPUT = {"type": "object"}  # list_files, read_file, export_outputs answer an object
_TEXT_OUTPUT = {  # write_file answers one line, also as {"result": line}
    "type": "object",
    "properties": {"result": {"type": "string"}},
    "required": ["result"],
}


def from_agent(spec: Spec, note: str = "", more: dict | None = None) -> types.Tool:
    """The agent's definition as an MCP client sees it: the MCP name, other tools named as
    MCP names them, `note` appended to the description, `more` optional arguments added."""
    description = _AGENT_NAME.sub(lambda m: MCP_NAMES[m.group(1)], spec.description)
    schema = copy.deepcopy(spec.parameters)
    schema["properties"].update(more or {})
    return types.Tool(
        name=MCP_NAMES[spec.name],
        description=f"{description} {note}".strip(),
        inputSchema=schema,
    )


def _only_mcp(name: str, description: str, arguments: dict, output: dict) -> types.Tool:
    """A tool the agent has no counterpart of: its arguments, all required unless they have a
    default, and no others."""
    required = [arg for arg, schema in arguments.items() if "default" not in schema]
    schema = {"type": "object", "properties": arguments, "additionalProperties": False}
    if required:
        schema["required"] = required
    return types.Tool(name=name, description=description, inputSchema=schema, outputSchema=output)


def definitions(limits: Limits) -> list[types.Tool]:
    """Every tool the server offers, with the server's limits in the schemas."""
    timeout_s = {
        "anyOf": [
            {"type": "number", "exclusiveMinimum": 0, "maximum": limits.timeout_s},
            {"type": "null"},
        ],
        "default": None,
        "description": "deadline of this cell in seconds",
    }
    any_path = file_metadata.SPEC.parameters["properties"]["path"]  # /data/<name> or /workspace
    return [
        from_agent(python.SPEC, PYTHON_NOTE, {"timeout_s": timeout_s}),
        from_agent(file_metadata.SPEC),
        from_agent(calculator.SPEC),
        _only_mcp(
            "list_files",
            "List the input files (read-only, /data) and the files in /workspace, with sizes. "
            "Use to see what the code wrote or what is there to read.",
            {},
            _DICT_OUTPUT,
        ),
        _only_mcp(
            "read_file",
            "Read a file from /data or /workspace: UTF-8 text as it is, anything else as "
            "base64; at most max_bytes (truncated says whether more was there). For small files "
            "and results; profile big data files with describe_file or load them in run_python.",
            {
                "path": any_path,
                "max_bytes": {
                    "type": "integer",
                    "exclusiveMinimum": 0,
                    "maximum": READ_MAX,
                    "default": READ_DEFAULT,
                },
            },
            _DICT_OUTPUT,
        ),
        _only_mcp(
            "write_file",
            "Write a text file into /workspace (a script, a lookup table, parameters) for "
            "run_python to use. /data is read-only.",
            {
                "path": {
                    "type": "string",
                    "description": "a path under /workspace (relative ones too)",
                },
                "content": {"type": "string", "description": "the text to write (UTF-8)"},
            },
            _TEXT_OUTPUT,
        ),
        _only_mcp(
            "export_outputs",
            "Copy /workspace/output to the folder the server was started with (--output) and "
            "return the host paths. Call once the results are written there.",
            {},
            _DICT_OUTPUT,
        ),
    ]
