"""tools: the tool registry and the tools the agent can call (python, calculator, file_metadata)."""

from sandcell.tools.calculator import calculator_tool
from sandcell.tools.file_metadata import file_metadata_tool, profile_inputs
from sandcell.tools.paths import DirSource, FileSource
from sandcell.tools.profile import Caps
from sandcell.tools.python import python_tool
from sandcell.tools.registry import Registry, Tool, ToolError, ToolOutcome

__all__ = [
    "Caps",
    "DirSource",
    "FileSource",
    "ToolOutcome",
    "Registry",
    "Tool",
    "ToolError",
    "calculator_tool",
    "file_metadata_tool",
    "profile_inputs",
    "python_tool",
]
