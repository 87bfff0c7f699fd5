"""`sandcell serve`: the HTTP API (agent.serve) under uvicorn, on loopback by default.

Without --users it makes one token and prints the URL that carries it, as Jupyter does.
Ctrl-C or SIGTERM stop it as they stop every command (exit 130 or 143): uvicorn finishes
its open requests, then every session ends and every container is removed."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from pathlib import Path

import click

from agent.cli import exits
from agent.cli.options import agent_options, build_limits, build_model, build_rules

ALLOWED_HOST_HELP = (
    "A name (Host header) this server answers to besides loopback names and the --host "
    "address, e.g. the name of a proxy in front (repeatable; '*' for any)."
)


def allowed_hosts_option(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    from agent.serve.guard import allowed_host_problem

    for value in values:
        problem = allowed_host_problem(value)
        if problem:
            raise click.BadParameter(problem)
    return values


GRACE_S = 5  # open streams get this long after Ctrl-C before they are cut


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def listening_socket(host: str, port: int) -> socket.socket:
    """Bound here so the URL printed names the real port (--port 0 picks one). The protocol
    is named: asyncio sets TCP_NODELAY only on sockets whose proto is TCP, and without it
    every keep-alive response waits out a 40 ms delayed ACK between its headers and body."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise click.UsageError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def warn_beyond_loopback(command: str, host: str) -> None:
    if not loopback(host):
        click.echo(
            f"sandcell {command}: warning: listening on {host}, beyond this machine; tokens "
            "travel in clear text unless a TLS proxy stands in front; a name other than the "
            "address (the proxy's) is answered only with --allowed-host NAME",
            err=True,
        )


def run_until_stopped(app, sock: socket.socket) -> None:
    """uvicorn on the bound socket until Ctrl-C or SIGTERM, which it re-raises once it has
    stopped gracefully (open requests get GRACE_S)."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,  # a URL may carry a token (the page's does)
            timeout_graceful_shutdown=GRACE_S,
            lifespan="on",
        )
    )
    server.run(sockets=[sock])


def claim_data(data: Path):
    """The --data folder for this server alone: two servers on one folder would resume the
    same sessions and write the same traces. An flock on DATA/.lock, held while the process
    lives (the kernel lets it go however the process ends, kill -9 too)."""
    import fcntl

    try:
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = os.fdopen(os.open(data / ".lock", os.O_RDWR | os.O_CREAT, 0o600), "r+")
    except OSError as error:  # read-only, another user's, not a folder
        raise click.UsageError(
            f"--data {data}: {error.strerror}; give a folder this user can write"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        if not isinstance(error, BlockingIOError):  # e.g. no locks on a network filesystem
            raise click.UsageError(
                f"--data {data}: cannot lock it ({error.strerror}); use a local folder"
            ) from None
        raise click.UsageError(
            f"--data {data} is in use by another sandcell serve ({holder}); stop it, or give "
            "this server a folder of its own"
        ) from None
    lock.truncate(0)
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


def users_of(path: Path | None) -> dict[str, str]:
    """--users FILE read (a usage error names the bad line), or one user with a new token."""
    from agent.serve.config import UsersError, load_users, one_user

    try:
        return load_users(path) if path else one_user()
    except (UsersError, UnicodeDecodeError) as error:
        raise click.UsageError(f"--users: {error}") from None


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option(
    "--data",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sandcell-data"),
    show_default=True,
    help="Folder for the sessions: DIR/<user>/<id>/ (uploads, trace, notebook, files).",
)
@click.option(
    "--users",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File of users, one name:token a line [default: one user, a token printed].",
)
@click.option(
    "--max-sessions",
    type=click.IntRange(1, 10_000),
    default=8,
    show_default=True,
    help="Sessions holding a sandbox at once; more answer 503 with Retry-After.",
)
@click.option(
    "--max-sessions-per-user",
    type=click.IntRange(1, 10_000),
    help="Of those, one user's at once; past it that user gets 429 with Retry-After "
    "[default: half of --max-sessions; all of them with one user].",
)
@click.option(
    "--max-user-mb",
    type=click.FloatRange(0, 1 << 30, min_open=True),
    default=2048.0,
    show_default=True,
    help="Disk for one user: uploads and session folders under DATA/<user> (507 past it).",
)
@click.option(
    "--pool",
    type=click.IntRange(0, 64),
    default=2,
    show_default=True,
    help="Warm sandboxes kept ready for new sessions.",
)
@click.option(
    "--idle-minutes",
    type=click.FloatRange(0, 7 * 24 * 60, min_open=True),
    default=30.0,
    show_default=True,
    help="An idle session's sandbox is released after this long (its next message starts one).",
)
@click.option(
    "--max-upload-mb",
    type=click.FloatRange(0, 1 << 20, min_open=True),
    default=100.0,
    show_default=True,
    help="Cap on one upload request (413 above it).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    callback=allowed_hosts_option,
    help=ALLOWED_HOST_HELP,
)
@agent_options
@exits.reported()
def serve_cmd(
    host,
    port,
    data,
    users,
    max_sessions,
    max_sessions_per_user,
    max_user_mb,
    pool,
    idle_minutes,
    max_upload_mb,
    allowed_hosts,
    opts,
):
    """Serve sessions over HTTP: a page for people (upload files, ask, see the code, outputs
    and answer as they come) and a JSON API with a live event stream for programs."""
    # Ctrl-C stops the server even when it was started with SIGINT ignored (any `cmd &` from a
    # script is): uvicorn raises it again, with this handler, once it has stopped.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from agent.serve import ServeConfig, create_app
    from agent.serve.config import DEFAULT_USER
    from sandbox.container import preflight

    known = users_of(users)
    model = build_model(opts)
    limits = build_limits(opts)
    preflight(runtime=limits.runtime)  # no engine, image or runtime: said now (exit 3)
    claimed = claim_data(data)
    config = ServeConfig(
        model=model,
        users=known,
        data=data,
        limits=limits,
        rules=build_rules(opts),
        protocol=opts["protocol"],
        vision=opts["vision"],
        max_sessions=max_sessions,
        max_sessions_per_user=max_sessions_per_user,
        max_user_mb=max_user_mb,
        pool=pool,
        idle_minutes=idle_minutes,
        max_upload_mb=max_upload_mb,
        host=host,
        allowed_hosts=allowed_hosts,
    )
    app = create_app(config)
    sock = listening_socket(host, port)
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{sock.getsockname()[1]}"
    exits.keep_details_in(Path(data))
    click.echo(f"sandcell serve: sessions in {Path(data).resolve()}; API at {base}/api/")
    if users:
        click.echo(f"sandcell serve: {len(known)} users from {users}; open {base}/")
    else:
        click.echo(f"sandcell serve: open {base}/?token={known[DEFAULT_USER]}")
        click.echo(f"sandcell serve: API clients send  Authorization: Bearer {known[DEFAULT_USER]}")
    warn_beyond_loopback("serve", host)
    try:
        run_until_stopped(app, sock)
    finally:
        sessions = getattr(app.state, "sessions", None)
        if sessions is not None:  # a second Ctrl-C skips the app's own shutdown
            sessions.close()
        sock.close()
        claimed.close()  # every session ended: --data is free for the next server
