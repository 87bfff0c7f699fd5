"""agent: the ReAct loop over any OpenAI-compatible model, its protocols, stop rules, budgets
and traces. The Python API:

    from agent import Agent, OpenAIModel
    result = Agent(model=OpenAIModel()).run("How many rows?", inputs=["sales.csv"])
    with Agent(model=...).session(inputs=[...]) as s: s.ask(...); s.ask(...)
"""

from agent.loop import Loop
from agent.models import OpenAIModel
from agent.scripted import ScriptedModel
from agent.seams import Action, Model, ModelError, Parsed, Reply, Result, ToolCall, Usage
from agent.session import Agent, Session
from agent.stops import Rules

__all__ = [
    "Action", "Agent", "Loop", "Model", "ModelError", "OpenAIModel", "Parsed", "Reply", "Result",
    "Rules", "ScriptedModel", "Session", "ToolCall", "Usage",
]  # fmt: skip
