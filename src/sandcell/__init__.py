"""sandcell: a sandboxed code-interpreter agent. The front door of its Python API:

    from sandcell import Agent, OpenAIModel, DockerSandbox, Limits
    with DockerSandbox(limits=Limits(timeout_s=30)) as sb:
        print(sb.run("1 + 1").text)
    with Agent(OpenAIModel()).session(inputs=["sales.csv"]) as session:
        print(session.ask("Which region sold most?").answer)

Everything installs under this one name: sandcell.sandbox (where code runs), sandcell.tools,
sandcell.agent (the loop, its model client, records, jobs and front ends) and sandcell.images
(the sandbox image's sources). This file lives in src/sandcell/ of a clone, the rest in the
clone's top-level folders (pyproject's package-dir).

OpenAIModel loads on first use (PEP 562), so importing sandcell loads no `openai`."""

from typing import TYPE_CHECKING, Any

from sandcell.agent import (
    Action,
    Agent,
    Loop,
    Model,
    ModelError,
    Parsed,
    Reply,
    Rules,
    RunResult,
    ScriptedModel,
    Session,
    ToolCall,
    Usage,
)
from sandcell.sandbox import (
    BackgroundSandbox,
    DockerSandbox,
    Execution,
    ExecutionError,
    Input,
    InputError,
    Inputs,
    Limits,
    RenewableSandbox,
    Result,
    Sandbox,
    SandboxError,
    SandboxPool,
    SandboxUnavailable,
    StreamChunk,
    render,
)
from sandcell.sandbox.image_build import sandcell_version
from sandcell.tools import Registry, Tool, ToolError, ToolOutcome

if TYPE_CHECKING:
    from sandcell.agent.model.openai_model import OpenAIModel

__version__ = sandcell_version()  # from the installed metadata: written once, in pyproject.toml

__all__ = [
    # the agent: a run, a session, their rules and result; the model seam and its two models
    "Agent", "Session", "Rules", "RunResult", "Loop", "Model", "ModelError", "OpenAIModel",
    "ScriptedModel", "Reply", "ToolCall", "Usage", "Action", "Parsed",
    # where code runs: the sandboxes, their limits and inputs, what a cell gives back
    "Sandbox", "DockerSandbox", "SandboxPool", "BackgroundSandbox", "RenewableSandbox",
    "Limits", "Inputs", "Input", "InputError", "SandboxError", "SandboxUnavailable",
    "Execution", "ExecutionError", "Result", "StreamChunk", "render",
    # the tools: the registry and its types
    "Registry", "Tool", "ToolError", "ToolOutcome",
    "__version__",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name == "OpenAIModel":
        from sandcell.agent.model.openai_model import OpenAIModel

        return OpenAIModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
