"""Streamable HTTP at /mcp: the SDK's session manager behind the SDK's bearer middleware,
with the users of `sandcell serve` (--users FILE, or one printed token).

Host and Origin are checked as `sandcell serve` checks them (agent.hosting.guard), before the
token. The session manager remembers which credential opened each session and answers any other
one as it answers an unknown session id (404); a request without a known token is 401. Each
MCP session gets its sandbox from the warm pool in the server's lifespan (agent.mcp.server),
and gives it back when the client ends the session, when it has been idle for
`idle_s`, or when the server stops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp.server import StreamableHTTPASGIApp
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from sandcell.agent.hosting.guard import Guard, Hosts
from sandcell.agent.hosting.users import token_owner

PATH = "/mcp"


class UsersVerifier:
    """The SDK's TokenVerifier over `name:token` users: the user's name is its client id,
    so a session opened by one user is refused to every other."""

    def __init__(self, users: dict[str, str]):
        self.users = users

    async def verify_token(self, token: str) -> AccessToken | None:
        name = token_owner(self.users, token)
        if name is None:
            return None
        return AccessToken(token=token, client_id=name, scopes=[], subject=name)


def http_app(
    server: Server, users: dict[str, str], hosts: Hosts, idle_s: float, max_sessions: int
) -> Starlette:
    manager = StreamableHTTPSessionManager(
        app=server,  # agent.mcp.server's: the tools and the lifespan that opens a sandbox
        # Host and Origin are checked by the Guard below, as `sandcell serve` checks them
        # (the SDK's own check knows loopback names only, and no --allowed-host)
        security_settings=None,
        session_idle_timeout=idle_s,
        max_sessions=max_sessions,  # more answer 503
    )
    endpoint = RequireAuthMiddleware(StreamableHTTPASGIApp(manager), required_scopes=[])

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with manager.run():  # on the way out every session ends, and its sandbox
            yield

    return Starlette(
        routes=[Route(PATH, endpoint=endpoint)],
        middleware=[
            # the MCP spec asks every request's Origin to be checked, not only a POST's; the
            # token is the SDK's to check (before the body too: RequireAuthMiddleware)
            Middleware(Guard, hosts=hosts, origin_on_every_method=True),
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(UsersVerifier(users))),
        ],
        lifespan=lifespan,
    )
