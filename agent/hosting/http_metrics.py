"""Each HTTP request of a server (serve, mcp --http) timed and counted, as an ASGI middleware
outside every other: its method, the route's template (never a session id: an unmatched path
is "other"), its status, and, where it was refused, why (REJECTION_KEY, set in the scope by
whoever refused it: the token guard, a full server, a user's cap or quota)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.agent.metrics import REJECTION_KEY, REJECTIONS, Metrics

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class HttpMetrics:
    """`routes`: the server's, for a request refused before routing. `refusals`: statuses that
    are refusals on this server whoever answered them (the MCP SDK's own 401 and 503), beside
    those a refusal marks in the scope."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        routes: Sequence[BaseRoute] = (),
        refusals: dict[int, str] | None = None,
    ):
        self.app, self.metrics, self.routes = app, metrics, routes
        self.refusals = refusals or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began, status = time.monotonic(), [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            template = _template(scope, self.routes)
            method = scope["method"] if scope["method"] in METHODS else "other"
            why = scope.get(REJECTION_KEY) or self.refusals.get(status[0])
            self.metrics.request(method, template, status[0], time.monotonic() - began, why)


def rejected(scope: Scope, status: int) -> None:
    """Say in the scope why a request is refused, for HttpMetrics (REJECTIONS' statuses)."""
    if status in REJECTIONS:
        scope[REJECTION_KEY] = REJECTIONS[status]


def _template(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """The template of the route the request went to; one refused before routing (the guard's
    401) is matched against `routes` here; a path none matches is "other"."""
    path = getattr(scope.get("route"), "path", None)
    for route in routes if path is None else ():
        if route.matches(scope)[0] != Match.NONE:  # PARTIAL: its path, another method
            path = getattr(route, "path", None)
            break
    return path or "other"
