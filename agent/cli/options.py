"""Options the commands share: --input, and for `run`, `batch` and `chat` the model endpoint
and the limits. The model client and the agent load only when a command builds them, so
`exec` can take --input from here and still start without them."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agent.stops import Rules
from sandbox.limits import Limits

if TYPE_CHECKING:
    from agent.seams import Model
    from agent.session import Agent


def input_option(help_text: str):
    """The repeatable --input PATH option: an existing file, mounted read-only."""
    return click.option(
        "--input",
        "inputs",
        multiple=True,
        help=help_text,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
    )


_OPTIONS = [
    click.option(
        "--model",
        "model_name",
        envvar="SANDCELL_MODEL",
        help="Model name at the endpoint [env SANDCELL_MODEL].",
    ),
    click.option(
        "--base-url",
        envvar="OPENAI_BASE_URL",
        help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 [env OPENAI_BASE_URL].",
    ),
    click.option("--api-key", envvar="OPENAI_API_KEY", help="API key [env OPENAI_API_KEY]."),
    click.option(
        "--replay",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Replay a file of scripted replies instead of calling a model.",
    ),
    click.option(
        "--protocol",
        type=click.Choice(["auto", "tools", "react"]),
        default="auto",
        show_default=True,
        help="Native tool calls, text ReAct, or detect.",
    ),
    click.option("--temperature", type=float, default=0.0, show_default=True),
    click.option("--max-tokens", type=int, default=None, help="Cap on each reply's tokens."),
    click.option(
        "--max-steps",
        type=int,
        default=Rules.max_steps,
        show_default=True,
        help="Model calls per question before one forced answer.",
    ),
    click.option(
        "--wall",
        "wall_s",
        type=float,
        default=Rules.wall_s,
        show_default=True,
        help="Seconds per question.",
    ),
    click.option(
        "--timeout",
        "timeout_s",
        type=float,
        default=Limits.timeout_s,
        show_default=True,
        help="Seconds per code cell.",
    ),
    click.option(
        "--memory",
        "memory_mb",
        type=int,
        default=Limits.memory_mb,
        show_default=True,
        help="Sandbox memory in MB.",
    ),
    click.option("--cpus", type=float, default=Limits.cpus, show_default=True),
]


def agent_options(command):
    """Add the model and limit options; the command receives them as `opts` (a dict)."""
    names = [
        "model_name",
        "base_url",
        "api_key",
        "replay",
        "protocol",
        "temperature",
        "max_tokens",
        "max_steps",
        "wall_s",
        "timeout_s",
        "memory_mb",
        "cpus",
    ]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        opts = {name: kwargs.pop(name) for name in names}
        return command(*args, opts=opts, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def build_model(opts: dict) -> Model:
    from agent.models import OpenAIModel
    from agent.scripted import ScriptedModel

    if opts["replay"]:
        return ScriptedModel(opts["replay"])
    return OpenAIModel(
        opts["model_name"],
        base_url=opts["base_url"],
        api_key=opts["api_key"],
        temperature=opts["temperature"],
        max_tokens=opts["max_tokens"],
    )


def build_agent(opts: dict, on_event=None) -> Agent:
    """The agent of `run` and `chat`. A missing engine or image is said now (exit 3), before
    any question; the sandbox itself starts in the background with the session."""
    from agent.session import Agent
    from sandbox.container import preflight

    model = build_model(opts)
    preflight()
    return Agent(
        model,
        limits=build_limits(opts),
        rules=build_rules(opts),
        protocol=opts["protocol"],
        on_event=on_event,
    )


def build_limits(opts: dict) -> Limits:
    return replace(
        Limits(), timeout_s=opts["timeout_s"], memory_mb=opts["memory_mb"], cpus=opts["cpus"]
    )


def build_rules(opts: dict) -> Rules:
    return replace(Rules(), max_steps=opts["max_steps"], wall_s=opts["wall_s"])
