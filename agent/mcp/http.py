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

import anyio
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp.server import StreamableHTTPASGIApp
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell.agent.hosting.guard import METRICS_PATH, Guard, Hosts
from sandcell.agent.hosting.http_metrics import HttpMetrics
from sandcell.agent.hosting.users import token_owner
from sandcell.agent.metrics import Metrics

PATH = "/mcp"
SDK_REFUSALS = {401: "auth", 503: "capacity"}


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
    server: Server,
    users: dict[str, str],
    hosts: Hosts,
    idle_s: float,
    max_sessions: int,
    metrics: Metrics,
    metrics_public: bool = False,
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

    async def scrape(request: Request) -> Response:  # off the loop: a gauge may ask Ray
        text = await anyio.to_thread.run_sync(metrics.text)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    routes = [Route(PATH, endpoint=endpoint), Route(METRICS_PATH, endpoint=scrape)]
    return Starlette(
        routes=routes,
        middleware=[
            # every request counted; here the SDK refuses a token (401) and a session past
            # --max-sessions (503) itself: by their status
            Middleware(HttpMetrics, metrics=metrics, routes=routes, refusals=SDK_REFUSALS),
            # the MCP spec asks every request's Origin to be checked, not only a POST's; /mcp's
            # token is the SDK's to check (before the body too: RequireAuthMiddleware), and
            # /metrics' the guard's
            Middleware(
                Guard,
                hosts=hosts,
                users=users,
                origin_on_every_method=True,
                metrics_public=metrics_public,
            ),  # fmt: skip
            Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(UsersVerifier(users))),
        ],
        lifespan=lifespan,
    )
