"""The command-line options both servers take: where to listen, who may connect, how many
sessions at once, how long an idle one lives. `sandcell mcp` takes them for --http only, and
its help says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.decorators import FC  # a function, or a command already made: what click decorates

if TYPE_CHECKING:
    from sandcell.agent.hosting.users import Users

ALLOWED_HOST_HELP = (
    "A name (Host header) this server answers to besides loopback names and the --host "
    "address, e.g. the name of a proxy in front (repeatable; '*' for any)."
)


METRICS_PUBLIC_HELP = (
    "Answer /metrics (Prometheus) without a token; only with a loopback --host [default: the "
    "same token as the API]."
)


def allowed_hosts_option(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    from sandcell.agent.hosting.guard import allowed_host_problem

    for value in values:
        problem = allowed_host_problem(value)
        if problem:
            raise click.BadParameter(problem)
    return values


def server_options(
    port: int, *, sessions_help: str, idle_help: str, http_only: bool = False
) -> Callable[[FC], FC]:
    """--host, --port, --users, --max-sessions, --pool, --idle-minutes, --allowed-host."""

    def said(text: str) -> str:
        return f"--http: {text[0].lower()}{text[1:]}" if http_only else text

    options = [
        click.option(
            "--host", default="127.0.0.1", show_default=True, help=said("Address to listen on.")
        ),
        click.option("--port", type=click.IntRange(0, 65535), default=port, show_default=True),
        click.option(
            "--users",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help=said("File of users, one name:token a line [default: one user, a token printed]."),
        ),
        click.option(
            "--max-sessions",
            type=click.IntRange(1, 10_000),
            default=8,
            show_default=True,
            help=said(sessions_help),
        ),
        click.option(
            "--pool",
            type=click.IntRange(0, 64),
            default=2,
            show_default=True,
            help=said("Warm sandboxes kept ready for new sessions."),
        ),
        click.option(
            "--idle-minutes",
            type=click.FloatRange(0, 7 * 24 * 60, min_open=True),
            default=30.0,
            show_default=True,
            help=said(idle_help),
        ),
        click.option(
            "--allowed-host",
            "allowed_hosts",
            multiple=True,
            callback=allowed_hosts_option,
            help=said(ALLOWED_HOST_HELP),
        ),
        click.option("--metrics-public", is_flag=True, help=said(METRICS_PUBLIC_HELP)),
    ]

    def apply(command: FC) -> FC:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


def check_metrics_public(public: bool, host: str, allowed_hosts: tuple[str, ...]) -> None:
    """--metrics-public on an address others reach (or behind a proxy: --allowed-host) would
    show anyone the server's numbers."""
    import ipaddress

    if public and allowed_hosts:
        raise click.UsageError(
            "--metrics-public is for a server only this machine reaches; with --allowed-host "
            "(a proxy in front) /metrics takes a token, as the API does"
        )
    if not public or host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise click.UsageError(
            f"--metrics-public needs a loopback --host (this one is {host}): elsewhere "
            "/metrics takes a token, as the API does (Prometheus: authorization.credentials)"
        )


def users_of(path: Path | None, allow_net: tuple[str, ...] = (), narrows: bool = True) -> Users:
    """--users FILE read (a usage error names the bad line), or one user with a new token;
    a user's allow-net= checked against the server's --allow-net (`narrows`: this server
    applies it; mcp does not)."""
    from sandcell.agent.hosting.users import Users, UsersError, load_users, one_user

    try:
        users = load_users(path) if path else one_user()
        if users.allow_net and not narrows:
            raise UsersError(
                "allow-net= in a user's line is for sandcell serve; sandcell mcp applies "
                "--allow-net to every session alike"
            )
        return Users(users.tokens, users.narrowed(allow_net))
    except (UsersError, UnicodeDecodeError) as error:
        raise click.UsageError(f"--users: {error}") from None
