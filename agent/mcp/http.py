"""Streamable HTTP at /mcp: the SDK's session manager behind the SDK's bearer middleware,
with the users of `sandcell serve` (--users FILE, or one printed token).

The session manager remembers which credential opened each session and answers any other
one as it answers an unknown session id (404); a request without a known token is 401. Each
MCP session gets its sandbox from the warm pool in the server's lifespan (agent.mcp.server),
and gives it back when the client ends the session, when it has been idle for
`idle_s`, or when the server stops."""

from __future__ import annotations

from contextlib import asynccontextmanager

from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.server import StreamableHTTPASGIApp
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from agent.serve.config import token_owner

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


def loopback_security(host: str) -> TransportSecuritySettings | None:
    """What FastMCP itself sets on loopback: DNS-rebinding protection (a web page the user
    opens cannot drive the server through a name that resolves to 127.0.0.1)."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


def http_app(
    server: FastMCP, users: dict[str, str], host: str, idle_s: float, max_sessions: int
) -> Starlette:
    manager = StreamableHTTPSessionManager(
        app=server._mcp_server,  # FastMCP's own low-level server: the tools and the lifespan
        security_settings=loopback_security(host),
        session_idle_timeout=idle_s,
        max_sessions=max_sessions,  # more answer 503
    )
    endpoint = RequireAuthMiddleware(StreamableHTTPASGIApp(manager), required_scopes=[])

    @asynccontextmanager
    async def lifespan(_app: Starlette):
        async with manager.run():  # on the way out every session ends, and its sandbox
            yield

    return Starlette(
        routes=[Route(PATH, endpoint=endpoint)],
        middleware=[
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(UsersVerifier(users)))
        ],
        lifespan=lifespan,
    )
