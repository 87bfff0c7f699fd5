"""The FastAPI app: `create_app(config)`. Its lifespan owns the sessions and the pool, so
stopping the server (Ctrl-C, SIGTERM, a test) removes every container. Errors are JSON
`{"error": "..."}` with the status that says what happened; routes live in routes.py."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from importlib.metadata import version

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from sandcell.agent.hosting.guard import Guard, Hosts
from sandcell.agent.hosting.http_metrics import HttpMetrics, rejected
from sandcell.agent.metrics import SESSION_STATES, Metrics, cluster_gauges
from sandcell.agent.serve.bodylimit import BodyLimit
from sandcell.agent.serve.config import ServeConfig
from sandcell.agent.serve.files import BadName, OverBudget
from sandcell.agent.serve.routes import STATIC, router
from sandcell.agent.serve.served import Busy
from sandcell.agent.serve.sessions import Full, NotFound, Sessions
from sandcell.sandbox import InputError, SandboxError
from sandcell.sandbox.protocol import Pool

log = logging.getLogger(__name__)


def create_app(config: ServeConfig, pool: Pool | None = None) -> FastAPI:
    """`pool`: where sessions take their sandboxes (with --ray, the cluster's, made and
    checked before the server listens); None: this host's engine, made with the sessions."""
    config = replace(config, data=config.data.expanduser().resolve())
    metrics = Metrics(config.limits.runtime)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.sessions = Sessions(config, pool, metrics)
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(app.state.sessions.close)

    app = FastAPI(
        title="sandcell",
        version=version("sandcell"),
        summary="Sessions of a code-interpreter agent whose Python runs in a sealed sandbox",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's docs pages load script from a CDN; the document is enough
        redoc_url=None,
    )
    app.state.config = config
    app.state.metrics = metrics
    _gauges(app, metrics, pool)
    app.state.users = config.users  # name -> token
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")  # the page's JS and CSS
    app.add_middleware(
        BodyLimit, body_bytes=config.max_body_bytes, upload_bytes=config.max_upload_bytes
    )
    # Host, Origin and the token are checked before any body is read or capped
    hosts = Hosts(config.host, config.allowed_hosts)
    app.add_middleware(Guard, hosts=hosts, users=config.users, metrics_public=config.metrics_public)
    # outermost: every request counted, by its route's template
    app.add_middleware(HttpMetrics, metrics=metrics, routes=[*router.routes, *app.routes])
    _errors(app)
    return app


def _gauges(app: FastAPI, metrics: Metrics, pool: Pool | None) -> None:
    """Sessions by state, read from the session table at each scrape (none before the
    lifespan made it); with --ray the cluster's nodes and slots. Once per app."""

    def states() -> dict[str, int]:
        sessions = getattr(app.state, "sessions", None)
        return sessions.states() if sessions is not None else dict.fromkeys(SESSION_STATES, 0)

    metrics.gauge("sandcell_sessions", "sessions by sandbox state", states, "state")
    if pool is not None:
        cluster_gauges(metrics, pool)


def _json(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _errors(app: FastAPI) -> None:
    statuses = {NotFound: 404, Busy: 409, BadName: 400, InputError: 400, SandboxError: 503}
    statuses[OverBudget] = 507  # Insufficient Storage: the user's --max-user-mb
    for kind, status in statuses.items():

        async def handler(request: Request, exc: Exception, status: int = status) -> JSONResponse:
            if isinstance(exc, OverBudget):
                rejected(request.scope, status)  # a quota: counted as refused
            return _json(status, str(exc))

        app.add_exception_handler(kind, handler)

    @app.exception_handler(Full)
    async def full(request: Request, exc: Full) -> JSONResponse:  # 503, or a user's own 429
        rejected(request.scope, exc.status)
        return _json(exc.status, str(exc), {"Retry-After": str(exc.retry_after)})

    @app.exception_handler(HTTPException)
    async def http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 401:  # a token the page or a route refused
            rejected(request.scope, 401)
        return _json(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        where = lambda e: ".".join(str(p) for p in e.get("loc", ()))  # noqa: E731
        problems = "; ".join(f"{where(e)}: {e.get('msg')}" for e in exc.errors())
        return _json(422, f"the request is not what this route takes: {problems}")

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return _json(500, f"internal error: {type(exc).__name__}; the server's log has details")
