"""A server's socket and its run: bound before the URL is printed, uvicorn on it until
Ctrl-C or SIGTERM, and a warning when it listens beyond this machine."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import click

from sandcell.agent.hosting.guard import loopback

if TYPE_CHECKING:
    from starlette.types import ASGIApp

GRACE_S = 5  # open streams get this long after Ctrl-C before they are cut


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


def run_until_stopped(app: ASGIApp, sock: socket.socket) -> None:
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
