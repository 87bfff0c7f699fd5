"""agent: the ReAct loop over any OpenAI-compatible model, its protocols, stop rules, budgets
and traces. The Python API:

    from agent import Agent, OpenAIModel
    result = Agent(model=OpenAIModel()).run("How many rows?", inputs=["sales.csv"])
    with Agent(model=...).session(inputs=[...]) as s: s.ask(...); s.ask(...)

The names load on first use (PEP 562), so a command that needs no model client (e.g.
`sandcell exec`) does not pay for importing it.
"""

import importlib

_HOMES = {
    "Loop": "agent.loop",
    "OpenAIModel": "agent.model.openai_model",
    "ScriptedModel": "agent.model.scripted",
    "Action": "agent.seams",
    "Model": "agent.seams",
    "ModelError": "agent.seams",
    "Parsed": "agent.seams",
    "Reply": "agent.seams",
    "RunResult": "agent.seams",
    "ToolCall": "agent.seams",
    "Usage": "agent.seams",
    "Agent": "agent.session",
    "Session": "agent.session",
    "Rules": "agent.stops",
}
# Deprecated, kept for one version: `agent.Result` is `agent.RunResult` (a run's result;
# `sandbox.Result` is one MIME output of a cell, as in E2B's SDK).
_RENAMED = {"Result": "RunResult"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    name = _RENAMED.get(name, name)
    if name not in _HOMES:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
