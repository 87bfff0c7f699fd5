"""The agent core: the ReAct loop over any OpenAI-compatible model, its protocols, stop rules,
budgets and traces. `from sandcell import Agent, Session, OpenAIModel` is the front door (the
model client, sandcell.agent.model.openai_model, is imported only there, on first use)."""

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

__all__ = [
    "Action",
    "Agent",
    "Loop",
    "Model",
    "ModelError",
    "Parsed",
    "Reply",
    "Rules",
    "RunResult",
    "ScriptedModel",
    "Session",
    "ToolCall",
    "Usage",
]
