"""The agent core: the ReAct loop over any OpenAI-compatible model, its protocols, stop rules,
budgets and traces. `from sandcell import Agent, Session, OpenAIModel` is the front door.

OpenAIModel loads on first use (PEP 562): a command that needs no model client (e.g.
`sandcell exec`) does not pay for importing `openai`. A type checker sees it through the
TYPE_CHECKING import."""

from typing import TYPE_CHECKING, Any

from sandcell.agent.loop import Loop
from sandcell.agent.model.scripted import ScriptedModel
from sandcell.agent.seams import (
    Action,
    Model,
    ModelError,
    Parsed,
    Reply,
    RunResult,
    ToolCall,
    Usage,
)
from sandcell.agent.session import Agent, Session
from sandcell.agent.stops import Rules

if TYPE_CHECKING:
    from sandcell.agent.model.openai_model import OpenAIModel

__all__ = [
    "Action",
    "Agent",
    "Loop",
    "Model",
    "ModelError",
    "OpenAIModel",
    "Parsed",
    "Reply",
    "Rules",
    "RunResult",
    "ScriptedModel",
    "Session",
    "ToolCall",
    "Usage",
]


def __getattr__(name: str) -> Any:
    if name == "OpenAIModel":
        from sandcell.agent.model.openai_model import OpenAIModel

        return OpenAIModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
