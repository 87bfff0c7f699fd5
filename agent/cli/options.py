"""Options the commands share: --input, and for `run`, `batch` and `chat` the model endpoint
and the limits. The model client and the agent load only when a command builds them, so
`exec` can take --input from here and still start without them."""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource
from click.decorators import FC  # a function, or a command already made: what click decorates

from sandcell.agent.model.settings import (
    API_KEY_ENV,
    BASE_URL_ENV,
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_ENV,
    MODEL_ENV,
    ModelSettings,
)
from sandcell.agent.stops import Rules
from sandcell.agent.vision import MODES as VISION_MODES
from sandcell.agent.vision import VISION_ENV
from sandcell.sandbox.limits import Limits

if TYPE_CHECKING:
    from sandcell.agent.events import OnEvent
    from sandcell.agent.output_checks import Expect
    from sandcell.agent.seams import Model
    from sandcell.agent.session import Agent
    from sandcell.sandbox.protocol import Pool

R = TypeVar("R")
NET_ENV = "SANDCELL_ALLOW_NET"  # --allow-net's entries, separated by spaces or commas
# An option decorator, as the shared lists hold them
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def input_option(help_text: str) -> Callable[[FC], FC]:
    """The repeatable --input PATH option: an existing file, mounted read-only."""
    return click.option(
        "--input",
        "inputs",
        multiple=True,
        help=help_text,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
    )


def output_option(help_text: str, required: bool = False) -> Callable[[FC], FC]:
    """The --output DIR option: a folder (made if missing), given as a Path."""
    return click.option(
        "--output",
        required=required,
        type=click.Path(file_okay=False, path_type=Path),
        help=help_text,
    )


# Ranges the sandbox can honour: below 128 MB the kernel and pandas cannot start, and Docker
# refuses more CPUs than the machine has.
TIMEOUT_S = click.FloatRange(0, 24 * 3600, min_open=True)
MEMORY_MB = click.IntRange(128, 1 << 20)
CPUS = click.FloatRange(0.01, float(os.cpu_count() or 1))
# Displays per cell, and their MB in all: the relay passes no single message over 16 MiB.
RICH_OUTPUTS = click.IntRange(0, 1000)
RICH_MB = click.IntRange(1, 1024)


def rich_options(command: FC) -> FC:
    """--max-rich-outputs N and --max-rich-mb MB: the rich outputs a cell keeps (displays and
    its value, figures among them), capped in the kernel and again on the host."""
    command = click.option(
        "--max-rich-mb",
        "rich_mb",
        type=RICH_MB,
        default=Limits.rich_bytes >> 20,
        show_default=True,
        help="MB of displayed outputs (figures, tables) kept per cell.",
    )(command)
    return click.option(
        "--max-rich-outputs",
        "rich_outputs",
        type=RICH_OUTPUTS,
        default=Limits.rich_outputs,
        show_default=True,
        help="Displayed outputs (figures, tables) kept per cell; more are dropped and counted.",
    )(command)


def ray_option(help_text: str) -> Callable[[FC], FC]:
    """--ray [ADDRESS]: a Ray cluster (see cluster_address); `help_text` says what for."""
    return click.option(
        "--ray", "ray_address", is_flag=False, flag_value="", default=None,
        metavar="[ADDRESS]", help=help_text,
    )  # fmt: skip


def cluster_address(given: str) -> str:
    """--ray's ADDRESS, else RAY_ADDRESS, else auto (the cluster `ray start` left here)."""
    return given or os.environ.get("RAY_ADDRESS") or "auto"


@contextmanager
def needing_ray() -> Iterator[None]:
    """Around the import of a module that imports Ray: a missing Ray is a usage error that
    says how to install it (any other missing module stays the error it is)."""
    try:
        yield
    except ImportError as error:
        if error.name != "ray" and not (error.name or "").startswith("ray."):
            raise
        raise click.UsageError(
            "--ray needs Ray on this host and on every node: pip install 'sandcell[ray]'"
        ) from None


def where_sandboxes_run(
    ray_address: str | None, size: int, limits: Limits
) -> tuple[str | None, Pool | None]:
    """This host's engine, image and runtime checked (None: the sessions make its pool); with
    --ray the cluster's address and pool, connected and checked. Either way a miss is said
    before the server listens (exit 3)."""
    if ray_address is None:
        from sandcell.sandbox.container import preflight

        preflight(runtime=limits.runtime, transport=limits.transport)
        return None, None
    address = cluster_address(ray_address)
    with needing_ray():
        from sandcell.sandbox.cluster import RayPool, reachable
    reachable(address)
    return address, RayPool(address, size, limits)


def runtime_option(command: FC) -> FC:
    """--runtime NAME: the engine's OCI runtime for the sandbox (runsc: gVisor). Any name the
    engine registered is fine, so it is checked against `docker info` before a start (exit 3
    pointing to `sandcell doctor`), not against a fixed list here."""
    return click.option(
        "--runtime",
        envvar="SANDCELL_RUNTIME",
        default=None,
        metavar="NAME",
        help="Container runtime for the sandbox, e.g. runsc (gVisor) [default: the engine's; "
        "env SANDCELL_RUNTIME].",
    )(command)


def transport_option(command: FC) -> FC:
    """--transport auto|ipc|stream: how the host reaches the sandbox (sandbox/transport.py)."""
    return click.option(
        "--transport",
        envvar="SANDCELL_TRANSPORT",
        type=click.Choice(["auto", "ipc", "stream"]),
        default="auto",
        show_default=True,
        help="How the host reaches the sandbox: ipc (folders a local engine mounts), stream "
        "(the engine's API alone: a remote engine, Docker Desktop, Podman), auto (ipc where "
        "it works) [env SANDCELL_TRANSPORT].",
    )(command)


def _wheelhouse(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--wheelhouse as Limits.wheelhouse: a folder; `none` turns it off; not given, DEFAULT
    (each machine's default one when it exists: on Ray, each node's own)."""
    from sandcell.sandbox.wheelhouse import DEFAULT, Wheelhouse

    if value is None:
        return DEFAULT
    if value.lower() == "none":
        return None
    house = Wheelhouse(Path(value).expanduser())
    if not house.exists():
        raise click.BadParameter(
            f"{value} is not a wheelhouse (no wheelhouse.json); make one with "
            f"`sandcell packages add --wheelhouse {value} NAME`, or pass none"
        )
    return str(house.path.resolve())


def wheelhouse_option(command: FC) -> FC:
    """--wheelhouse DIR|none: the operator's packages `%pip install` may take, offline."""
    return click.option(
        "--wheelhouse",
        metavar="DIR|none",
        callback=_wheelhouse,
        help="The wheelhouse the sandbox may `%pip install` from, offline (`sandcell packages`) "
        "[default: $SANDCELL_WHEELHOUSE or ~/.cache/sandcell/wheelhouse when it exists; none: "
        "no packages beyond the image's].",
    )(command)


def net_options(command: FC) -> FC:
    """--allow-net HOST[:PORT] (repeatable, comma lists) and --net-mb: the hosts the sandbox
    may reach through the host's proxy (sandbox/allowlist.py), and the bytes it may move."""
    command = click.option(
        "--net-mb",
        type=click.IntRange(1, 1 << 20),
        default=Limits.net_mb,
        show_default=True,
        help="With --allow-net: bytes (in MB) all of a sandbox's connections may move.",
    )(command)
    return click.option(
        "--allow-net",
        "allow_net",
        multiple=True,
        metavar="HOST[:PORT]",
        envvar=NET_ENV,
        callback=_allowlist,
        help="A host the sandbox may reach through a proxy on this host (repeatable, or a "
        "comma list; *.example.org for its subdomains; ports 443 and 80 unless given). A name "
        "that resolves to a loopback, private or link-local address is refused unless written "
        f"internal:HOST[:PORT]. [default: ${NET_ENV}, else no network at all]",
    )(command)


def _allowlist(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    from sandcell.sandbox.allowlist import Allowlist

    try:
        return tuple(str(entry) for entry in Allowlist.parse(value).entries)
    except ValueError as error:
        raise click.BadParameter(str(error).removeprefix("--allow-net ")) from None


def task_text(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --task that says something: empty or blank text is a usage error."""
    if value is not None and not value.strip():
        raise click.BadParameter("the task is empty; say what to do, e.g. --task 'Clean sales.csv'")
    return value


SANDCELL_FILES = ("answer.md", "trace.jsonl", "notebook.ipynb", "output", "figures", "workspace")


def check_output_folder(folder: Path, overwrite: bool) -> None:
    """A folder already holding files is refused (old and new results would mix) unless
    --overwrite: a usage error, said before anything else is checked."""
    if folder.exists() and not folder.is_dir():
        raise click.UsageError(f"--output {folder} is a file; give a folder")
    if folder.is_dir() and any(folder.iterdir()) and not overwrite:
        raise click.UsageError(
            f"--output {folder} is not empty: its old results would mix with the new. "
            "Give a new folder, or pass --overwrite to replace sandcell's files there."
        )


def output_folder(folder: Path, overwrite: bool) -> Path:
    """A folder for one run or chat, checked as above; --overwrite removes what sandcell
    wrote there before and nothing else."""
    check_output_folder(folder, overwrite)
    if folder.is_dir() and overwrite:
        for name in SANDCELL_FILES:
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def overwrite_option(command: FC) -> FC:
    return click.option(
        "--overwrite",
        is_flag=True,
        help="Reuse a non-empty --output folder, replacing sandcell's earlier files there.",
    )(command)


# No envvar= on the endpoint's options: ModelSettings.from_env reads those variables (once).
_OPTIONS: list[Decorator] = [
    click.option("--model", "model_name", help=f"Model name at the endpoint [env {MODEL_ENV}]."),
    click.option(
        "--base-url",
        help=f"OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 [env {BASE_URL_ENV}].",
    ),
    click.option("--api-key", help=f"API key [env {API_KEY_ENV}]."),
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
    click.option(
        "--vision",
        type=click.Choice(VISION_MODES),
        envvar=VISION_ENV,
        default="auto",
        show_default=True,
        help="Show the model the figures its code made (as images): auto stops sending them "
        f"once the endpoint refuses images [env {VISION_ENV}].",
    ),
    click.option("--temperature", type=click.FloatRange(0, 2), default=0.0, show_default=True),
    click.option(
        "--max-tokens",
        type=click.IntRange(min=1),
        default=DEFAULT_MAX_TOKENS,  # shown; when not given, SANDCELL_MAX_TOKENS may say
        show_default=True,
        help="Cap on each reply's tokens, so a model that never stops still ends "
        f"[env {MAX_TOKENS_ENV}].",
    ),
    click.option(
        "--max-steps",
        type=click.IntRange(1, 1000),
        default=Rules.max_steps,
        show_default=True,
        help="Model calls per question before one forced answer.",
    ),
    click.option(
        "--wall",
        "wall_s",
        type=click.FloatRange(1, 7 * 86400),
        default=Rules.wall_s,
        show_default=True,
        help="Seconds per question.",
    ),
]

# The sandbox limits: part of the agent options, and on their own for `mcp`.
_LIMIT_OPTIONS: list[Decorator] = [
    click.option(
        "--timeout",
        "timeout_s",
        type=TIMEOUT_S,
        default=Limits.timeout_s,
        show_default=True,
        help="Seconds per code cell.",
    ),
    click.option(
        "--memory",
        "memory_mb",
        type=MEMORY_MB,
        default=Limits.memory_mb,
        show_default=True,
        help="Sandbox memory in MB.",
    ),
    click.option("--cpus", type=CPUS, default=Limits.cpus, show_default=True),
    rich_options,
    runtime_option,
    transport_option,
    wheelhouse_option,
    net_options,
]


_MODEL_NAMES = ["model_name", "base_url", "api_key", "replay", "protocol", "vision"]
_MODEL_NAMES += ["temperature"]
_MODEL_NAMES += ["max_tokens", "max_steps", "wall_s"]
_LIMIT_NAMES = ["timeout_s", "memory_mb", "cpus", "rich_outputs", "rich_mb", "runtime"]
_LIMIT_NAMES += ["wheelhouse", "transport", "allow_net", "net_mb"]


def _gathered(
    command: Callable[..., R], options: list[Decorator], names: list[str]
) -> Callable[..., R]:
    """Add the options; the command receives them as `opts` (a dict)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> R:
        opts = {name: kwargs.pop(name) for name in names}
        return command(*args, opts=opts, **kwargs)

    decorated: Callable[..., R] = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def agent_options(command: Callable[..., R]) -> Callable[..., R]:
    """Add the model and limit options; the command receives them as `opts` (a dict), the
    endpoint's as one value, opts["model"] (ModelSettings), resolved before the command runs."""

    @functools.wraps(command)
    def resolved(*args: Any, opts: dict[str, Any], **kwargs: Any) -> R:
        return command(*args, opts=with_model_settings(opts), **kwargs)

    return _gathered(resolved, _OPTIONS + _LIMIT_OPTIONS, _MODEL_NAMES + _LIMIT_NAMES)


def with_model_settings(opts: dict[str, Any]) -> dict[str, Any]:
    """opts with the endpoint's flags replaced by opts["model"]: each flag given wins, else its
    variable, else the default. A bad SANDCELL_MAX_TOKENS is a usage error (exit 2)."""
    from sandcell.agent.seams import ModelError

    opts = dict(opts)
    given = {"name": opts.pop("model_name"), "base_url": opts.pop("base_url")}
    given.update(api_key=opts.pop("api_key"), temperature=opts.pop("temperature"))
    max_tokens = opts.pop("max_tokens")
    source = click.get_current_context().get_parameter_source("max_tokens")
    if source is not ParameterSource.DEFAULT:  # the shown default lets the variable say
        given["max_tokens"] = max_tokens
    try:
        opts["model"] = ModelSettings.from_env(**given)
    except ModelError as error:
        raise click.UsageError(str(error)) from None
    return opts


def limit_options(command: Callable[..., R]) -> Callable[..., R]:
    """Add the sandbox limit options only (--timeout, --memory, --cpus, --max-rich-outputs,
    --max-rich-mb, --runtime, --transport, --wheelhouse, --allow-net, --net-mb), as `opts`."""
    return _gathered(command, _LIMIT_OPTIONS, _LIMIT_NAMES)


def build_model(opts: dict[str, Any]) -> Model:
    from sandcell.agent.model.openai_model import OpenAIModel
    from sandcell.agent.model.scripted import ScriptedModel

    if opts["replay"]:
        return ScriptedModel(opts["replay"])
    return OpenAIModel.from_settings(opts["model"])


def build_agent(opts: dict[str, Any], on_event: OnEvent | None = None) -> Agent:
    """The agent of `run` and `chat`. A missing engine or image is said now (exit 3), before
    any question; the sandbox itself starts in the background with the session."""
    from sandcell.agent.session import Agent
    from sandcell.sandbox.container import preflight

    model = build_model(opts)
    limits = build_limits(opts)
    preflight(runtime=limits.runtime, transport=limits.transport)
    return Agent(
        model,
        limits=limits,
        rules=build_rules(opts),
        protocol=opts["protocol"],
        vision=opts["vision"],
        on_event=on_event,
    )


def build_limits(opts: dict[str, Any]) -> Limits:
    return replace(
        Limits(),
        timeout_s=opts["timeout_s"],
        memory_mb=opts["memory_mb"],
        cpus=opts["cpus"],
        rich_outputs=opts["rich_outputs"],
        rich_bytes=opts["rich_mb"] << 20,
        runtime=opts["runtime"] or None,  # SANDCELL_RUNTIME= (empty) is the engine's default
        wheelhouse=opts["wheelhouse"],
        transport=opts["transport"],
        allow_net=opts["allow_net"],
        net_mb=opts["net_mb"],
    )


def build_rules(opts: dict[str, Any]) -> Rules:
    rules = replace(Rules(), max_steps=opts["max_steps"], wall_s=opts["wall_s"])
    if opts.get("check_retries") is not None:  # run and batch: --check-retries
        rules = replace(rules, check_retries=opts["check_retries"])
    return rules


def check_options(command: FC) -> FC:
    """--expect OUT=SCHEMA (repeatable) and --check-retries N, for run and batch."""
    command = click.option(
        "--check-retries",
        type=click.IntRange(1, 100),
        default=Rules.check_retries,
        show_default=True,
        help="Final answers whose outputs fail their checks before the job stops (checks_failed).",
    )(command)
    return click.option(
        "--expect",
        "expect",
        multiple=True,
        metavar="OUT=SCHEMA",
        help="An output under /workspace and the pandera schema (YAML or JSON) it must "
        "pass, e.g. output/clean.csv=sales.yaml (repeatable).",
    )(command)


def expect_option_value(pairs: tuple[str, ...]) -> Expect:
    """--expect values loaded (schema paths relative to here); a bad one exits 2."""
    from sandcell.agent.output_checks import ExpectError, parse_pairs

    try:
        return parse_pairs(pairs, Path.cwd())
    except ExpectError as error:
        raise click.UsageError(str(error)) from None
