"""`sandcell mcp`: the sealed sandbox as an MCP server (agent.mcp), over stdio or HTTP.

stdio: stdout is the protocol channel, so nothing else is printed there (messages go to
stderr); one sandbox lives as long as the process, begun in the background so `initialize`
answers at once, and closed when stdin ends, on Ctrl-C or on SIGTERM.
--http: streamable HTTP at /mcp, one sandbox per MCP session from a warm pool (--ray: the
Ray cluster's `RayPool`, a sandbox on a node)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from sandcell.agent.cli import exits
from sandcell.agent.cli.options import (
    build_limits,
    check_output_folder,
    input_option,
    limit_options,
    output_option,
    overwrite_option,
    ray_option,
    where_sandboxes_run,
)
from sandcell.agent.hosting.server_options import check_metrics_public, server_options, users_of
from sandcell.agent.seams import Terminated

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server

    from sandcell.agent.metrics import Metrics
    from sandcell.sandbox import DockerSandbox, Inputs, Limits
    from sandcell.sandbox.protocol import Pool


@click.command("mcp")
@input_option("A file every sandbox sees read-only at /data/<name> (repeatable).")
@output_option("Folder export_outputs copies /workspace/output to (with --http: DIR/<session>/).")
@click.option("--http", is_flag=True, help="Serve streamable HTTP at /mcp instead of stdio.")
@server_options(
    8766,
    sessions_help="Sessions at once; more answer 503.",
    idle_help="A session idle this long ends and its sandbox is removed.",
    http_only=True,
)
@ray_option(
    "--http: each session's sandbox on a node of a Ray cluster (ADDRESS, else RAY_ADDRESS, "
    "else auto; nodes declare --resources '{\"sandcell\": N}'); --pool is then per node. "
    "Needs pip install 'sandcell[ray]'."
)
@overwrite_option
@limit_options
@exits.reported()
def mcp_cmd(
    inputs: tuple[Path, ...],
    output: Path | None,
    http: bool,
    host: str,
    port: int,
    users: Path | None,
    pool: int,
    max_sessions: int,
    idle_minutes: float,
    allowed_hosts: tuple[str, ...],
    metrics_public: bool,
    ray_address: str | None,
    overwrite: bool,
    opts: dict[str, Any],
) -> None:
    """Serve the sandbox to MCP clients: run_python, describe_file, list_files, read_file,
    write_file, calculator, export_outputs. Over stdio by default (one sandbox for the
    process); --http serves streamable HTTP at /mcp with bearer tokens, a sandbox per session."""
    from sandcell.sandbox import Inputs

    click.get_current_context().call_on_close(_quiet_sdk_logs())
    limits, checked = build_limits(opts), Inputs.from_paths(list(inputs))
    if output is not None:
        # stdio exports into the folder itself: its files are not replaced unless asked;
        # over HTTP each session exports into a fresh DIR/<session>/
        check_output_folder(output, overwrite or http)
        if any(i.path.resolve().is_relative_to(output.resolve()) for i in checked):
            raise click.UsageError(
                f"--output {output} holds an --input file, which an export could replace; "
                "give an output folder apart from the inputs"
            )
    if not http:
        _refuse_http_options()
    # no engine, image or runtime (with --ray: no cluster): exit 3, before any client waits
    _, cluster = where_sandboxes_run(ray_address, pool, limits)
    if not http:
        _serve_stdio(limits, checked, output)
        return
    check_metrics_public(metrics_public, host, allowed_hosts)
    users_known = users_of(users, narrows=False).tokens
    settings = HttpSettings(
        users_known, bool(users), host, port, pool, idle_minutes * 60, max_sessions, allowed_hosts,
        metrics_public,
    )  # fmt: skip
    _serve_http(limits, checked, output, settings, cluster)


@dataclass(frozen=True)
class HttpSettings:
    users: dict[str, str]  # name -> token
    from_file: bool  # else one token was made, and is printed
    host: str
    port: int
    pool: int
    idle_s: float
    max_sessions: int
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host
    metrics_public: bool = False  # --metrics-public


def _serve_stdio(limits: Limits, inputs: Inputs, output: Path | None) -> None:
    from sandcell.agent.mcp.server import SessionSandboxes, build_server, run_stdio
    from sandcell.sandbox import DockerSandbox
    from sandcell.sandbox.pool import warmed

    def start() -> DockerSandbox:  # pandas loaded before the first call, as for a Session's sandbox
        return warmed(DockerSandbox(limits, inputs))

    cells = SessionSandboxes(start, limits, inputs, output, per_session_output=False)
    # Ctrl-C raised where it lands, as SIGTERM is: asyncio's own handler would cancel the
    # server and then wait forever on the stdin reader thread.
    signal.signal(signal.SIGINT, _interrupt)
    try:
        run_stdio(build_server(cells, limits))
    except (KeyboardInterrupt, Terminated) as stop:
        cells.close_all()
        _exit_now(stop)
    finally:
        cells.close_all()


def _quiet_sdk_logs() -> Callable[[], None]:
    """The SDK logs races of its own at a session's end as errors with tracebacks (a closed
    stream in its SSE writer); the client sees every failure that matters in its responses,
    so the terminal shows the SDK's records only with --debug, one line each as sandcell's."""
    level = logging.DEBUG if exits.Debug.enabled else logging.CRITICAL
    return exits.take_over(logging.getLogger("mcp"), logging.getLogger("sandcell").handlers, level)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _exit_now(stop: BaseException) -> NoReturn:
    """Ctrl-C or SIGTERM on stdio: the SDK's stdin reader thread sits in a read() that only
    the client can end, so a normal exit would wait for it forever; the sandbox is closed
    already, so leave at once with the usual line and status."""
    click.echo(f"sandcell: {str(stop) or 'interrupted'}", err=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # the SDK may have closed stdout
            stream.flush()
    os._exit(exits.for_error(stop))


HTTP_ONLY = (
    "host", "port", "users", "pool", "max_sessions", "idle_minutes", "allowed_hosts",
    "metrics_public", "ray_address",
)  # fmt: skip


def _refuse_http_options() -> None:
    """An HTTP option given to the stdio server would be ignored: say so instead."""
    ctx = click.get_current_context()
    for name in HTTP_ONLY:
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            flag = next(p.opts[0] for p in ctx.command.params if p.name == name)
            raise click.UsageError(f"{flag} is for --http; stdio has one client, its parent")


def _serve_http(
    limits: Limits,
    inputs: Inputs,
    output: Path | None,
    settings: HttpSettings,
    cluster: Pool | None,
) -> None:
    """`cluster`: --ray's pool of sandboxes on the cluster's nodes, else one on this host."""
    from sandcell.agent.mcp.server import SessionSandboxes, build_server
    from sandcell.agent.metrics import Metrics, cluster_gauges
    from sandcell.sandbox import SandboxPool

    metrics = Metrics(limits.runtime)
    warm = cluster or SandboxPool(size=settings.pool, limits=limits)
    cells = SessionSandboxes(
        lambda: warm.acquire(inputs), limits, inputs, output, per_session_output=True,
        observe=metrics.observe,
    )  # fmt: skip
    metrics.gauge("sandcell_sessions", "sessions by sandbox state", cells.states, "state")
    if cluster is not None:
        cluster_gauges(metrics, cluster)
    try:
        _serve_on_socket(build_server(cells, limits), settings, metrics)
    finally:
        cells.close_all()
        warm.close()


def _serve_on_socket(server: Server, settings: HttpSettings, metrics: Metrics) -> None:
    from sandcell.agent.hosting.guard import Hosts
    from sandcell.agent.hosting.listening import (
        listening_socket,
        run_until_stopped,
        warn_beyond_loopback,
    )
    from sandcell.agent.mcp.http import PATH, http_app

    host, known = settings.host, settings.users
    hosts = Hosts(host, settings.allowed_hosts)
    app = http_app(
        server, known, hosts, settings.idle_s, settings.max_sessions, metrics,
        settings.metrics_public,
    )  # fmt: skip
    sock = listening_socket(host, settings.port)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"sandcell mcp: streamable HTTP at http://{shown}:{sock.getsockname()[1]}{PATH}")
    warn_beyond_loopback("mcp", host)
    if settings.from_file:
        click.echo(f"sandcell mcp: {len(known)} users; clients send Authorization: Bearer TOKEN")
    else:
        token = next(iter(known.values()))
        click.echo(f"sandcell mcp: clients send  Authorization: Bearer {token}")
    try:
        run_until_stopped(app, sock)
    finally:
        sock.close()
