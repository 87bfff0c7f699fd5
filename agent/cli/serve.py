"""`sandcell serve`: the HTTP API (agent.serve) under uvicorn, on loopback by default.

Without --users it makes one token and prints the URL that carries it, as Jupyter does.
Ctrl-C or SIGTERM stop it as they stop every command (exit 130 or 143): uvicorn finishes
its open requests, then every session ends and every container is removed."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

from sandcell.agent.cli import exits
from sandcell.agent.cli.options import (
    FC,
    agent_options,
    build_limits,
    build_model,
    build_rules,
    ray_option,
    where_sandboxes_run,
)
from sandcell.agent.hosting.listening import (
    listening_socket,
    run_until_stopped,
    warn_beyond_loopback,
)
from sandcell.agent.hosting.server_options import (
    check_metrics_public,
    server_options,
    users_of,
)

if TYPE_CHECKING:
    from sandcell.agent.serve import ServeConfig


def claim_data(data: Path, on_refusal: Callable[[], None] | None = None) -> TextIO:
    """The --data folder for this server alone: two servers on one folder would resume the
    same sessions and write the same traces. An flock on DATA/.lock, held while the process
    lives (the kernel lets it go however the process ends, kill -9 too). `on_refusal` runs
    first when it cannot be had (with --ray: the cluster's sandboxes go)."""
    try:
        return _claim(data)
    except BaseException:
        if on_refusal is not None:
            on_refusal()
        raise


def _claim(data: Path) -> TextIO:
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


def _megabytes_option(name: str, most: float, default: float, help_text: str) -> Callable[[FC], FC]:
    """A cap in megabytes, more than 0 and at most `most`."""
    return click.option(
        name,
        type=click.FloatRange(0, most, min_open=True),
        default=default,
        show_default=True,
        help=help_text,
    )


@click.command("serve")
@server_options(
    8765,
    sessions_help="Sessions holding a sandbox at once; more answer 503 with Retry-After.",
    idle_help="An idle session's sandbox is paused (gVisor: its next message resumes the kernel) "
    "or released (its next message starts a fresh one) after this long.",
)
@click.option(
    "--data",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sandcell-data"),
    show_default=True,
    help="Folder for the sessions: DIR/<user>/<id>/ (uploads, trace, notebook, files).",
)
@click.option(
    "--max-sessions-per-user",
    type=click.IntRange(1, 10_000),
    help="Of those, one user's at once; past it that user gets 429 with Retry-After "
    "[default: half of --max-sessions; all of them with one user].",
)
@_megabytes_option(
    "--max-user-mb",
    1 << 30,
    2048.0,
    "Disk for one user: uploads and session folders under DATA/<user> (507 past it).",
)
@_megabytes_option("--max-upload-mb", 1 << 20, 100.0, "Cap on one upload request (413 above it).")
@ray_option(
    "Each session's sandbox on a node of a Ray cluster (ADDRESS, else RAY_ADDRESS, else "
    "auto; nodes declare --resources '{\"sandcell\": N}'); --pool is then per node. The "
    "loop, model calls and files stay here. Needs pip install 'sandcell[ray]'."
)
@click.option(
    "--stop-grace",
    type=click.FloatRange(0, 3600),
    default=8.0,
    show_default=True,
    help="Seconds a stopping server (SIGTERM, Ctrl-C) gives its sessions' pauses (gVisor); "
    "one not done by then is closed, and replayed after a restart (0: none is paused). Keep "
    "it below your supervisor's stop timeout (Docker's: 10 s).",
)
@agent_options
@exits.reported()
def serve_cmd(
    host: str,
    port: int,
    data: Path,
    users: Path | None,
    max_sessions: int,
    max_sessions_per_user: int | None,
    max_user_mb: float,
    pool: int,
    idle_minutes: float,
    max_upload_mb: float,
    allowed_hosts: tuple[str, ...],
    metrics_public: bool,
    stop_grace: float,
    ray_address: str | None,
    opts: dict[str, Any],
) -> None:
    """Serve sessions over HTTP: a page for people (upload files, ask, see the code, outputs
    and answer as they come) and a JSON API with a live event stream for programs."""
    from sandcell.agent.serve import ServeConfig, create_app

    check_metrics_public(metrics_public, host, allowed_hosts)
    known = users_of(users, opts["allow_net"])
    model = build_model(opts)
    limits = build_limits(opts)
    ray_address, sandboxes = where_sandboxes_run(ray_address, pool, limits)
    claimed = claim_data(data, on_refusal=sandboxes.close if sandboxes else None)
    config = ServeConfig(
        model=model,
        users=known.tokens,
        user_allow_net=known.allow_net,
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
        stop_grace_s=stop_grace,
        max_upload_mb=max_upload_mb,
        host=host,
        allowed_hosts=allowed_hosts,
        metrics_public=metrics_public,
        ray_address=ray_address,
    )
    app = create_app(config, sandboxes)
    sock = listening_socket(host, port)
    exits.keep_details_in(Path(data))
    say_where(sock, config, users)
    try:
        run_until_stopped(app, sock)
    finally:
        sessions = getattr(app.state, "sessions", None)
        if sessions is not None:  # a second Ctrl-C skips the app's own shutdown
            sessions.close()
        sock.close()
        claimed.close()  # every session ended: --data is free for the next server


def say_where(sock: socket.socket, config: ServeConfig, users_file: Path | None) -> None:
    """The URLs of the page and the API; without --users, the one token they take."""
    from sandcell.agent.hosting.users import DEFAULT_USER

    host = config.host
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{sock.getsockname()[1]}"
    click.echo(f"sandcell serve: sessions in {Path(config.data).resolve()}; API at {base}/api/")
    if users_file:
        click.echo(f"sandcell serve: {len(config.users)} users from {users_file}; open {base}/")
    else:
        token = config.users[DEFAULT_USER]
        click.echo(f"sandcell serve: open {base}/?token={token}")
        click.echo(f"sandcell serve: API clients send  Authorization: Bearer {token}")
    warn_beyond_loopback("serve", host)
