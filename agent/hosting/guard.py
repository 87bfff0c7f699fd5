"""Checks made on a request's headers, before any route runs or any body is read:

- Host: a name this server answers to (DNS rebinding: a page on evil.example whose name
  comes to resolve to this machine must not drive the server). On loopback only loopback
  names; beyond it also the address bound (on 0.0.0.0 or :: any IP address, which no
  rebinding page can have as its origin); `--allowed-host NAME` adds names, `'*'` any. The
  name is checked, not the port, so a forwarded port keeps working. 403.
- Origin: a state-changing request (POST, PUT, PATCH, DELETE) that carries an Origin must come
  from this server's own origin (the Host it was sent to); API clients send none. 403.
- A token, for every /api/ route but /api/health: a Bearer header or the page's cookie naming
  one of the users, else 401 at once, so nobody without a token makes the server read, parse
  or spool a body. Routes still name the user through auth.current_user.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from functools import cached_property
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from sandcell.agent.hosting.http_metrics import rejected
from sandcell.agent.hosting.users import token_owner

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OPEN_API = frozenset({"/api/health"})  # answered without a token
METRICS_PATH = "/metrics"  # Prometheus' scrape: a token too, unless --metrics-public
ANY = "*"  # --allowed-host '*': every Host (a proxy in front checks names)
COOKIE = "sandcell_token"  # HttpOnly, SameSite=Strict: set by the page route from ?token=


def loopback(host: str) -> bool:
    """An address of this machine only (127.0.0.0/8, ::1, or the name localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def hostname_of(netloc: str) -> str | None:
    """The name in a Host header or an origin's netloc, lower case, without port or
    brackets; None when it is not one."""
    try:
        return urlsplit("//" + netloc).hostname or None
    except ValueError:  # a port that is not a number, an unclosed bracket
        return None


@dataclass(frozen=True)
class Hosts:
    """The names a server bound to `bound` answers to."""

    bound: str  # --host
    allowed: tuple[str, ...] = ()  # --allowed-host

    @cached_property
    def names(self) -> frozenset[str]:  # as hostname_of gives them: no port, lower case
        names = (n if n == ANY else hostname_of(n) for n in self.allowed)
        return frozenset(n for n in names if n is not None)

    def allows(self, name: str) -> bool:
        if ANY in self.names or name in self.names or loopback(name):
            return True
        bound = hostname_of(self.bound) or self.bound.lower()
        if name == bound or loopback(bound):  # bound to loopback: loopback names only
            return name == bound
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False  # a DNS name, not listed
        return bound in ("0.0.0.0", "::")  # any address of this machine


def allowed_host_problem(value: str) -> str | None:
    """What is wrong with an --allowed-host value, or None: a name (a port, if given, is
    not checked), an IP address, or '*'."""
    if value == ANY:
        return None
    name = hostname_of(value)
    if name is None or any(c in value for c in "/@?#") or "*" in value:
        return f"{value!r} is not a host name; give one like sandcell.example.org, or '*'"
    return None


def bearer_or_cookie(conn: HTTPConnection) -> str | None:
    """The token as auth.current_user reads it: a Bearer header wins over the cookie."""
    scheme, _, credentials = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return conn.cookies.get(COOKIE)


class Guard:
    """Host, Origin and (when `users` is given) token checks as an ASGI middleware: nothing
    here awaits `receive`, so a refused request's body is never read by the app (uvicorn
    drops what the client still sends, and answers the next request on the connection)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: Hosts,
        users: dict[str, str] | None = None,
        origin_on_every_method: bool = False,
        metrics_public: bool = False,  # /metrics without a token (a loopback server's choice)
    ):
        self.app, self.hosts, self.users = app, hosts, users
        self.origin_on_every_method = origin_on_every_method
        self.metrics_public = metrics_public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self.refusal(HTTPConnection(scope), scope["method"])
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, message, headers = refused
        rejected(scope, status)
        await send_error(send, status, message, headers)

    def refusal(self, conn: HTTPConnection, method: str) -> tuple[int, str, dict] | None:
        host = conn.headers.get("host")
        if host is not None:  # HTTP/1.0 may leave it out; no browser does
            name = hostname_of(host)
            if name is None or not self.hosts.allows(name):
                return 403, _bad_host(host, name), {}
        origin = conn.headers.get("origin")
        checked = self.origin_on_every_method or method in STATE_CHANGING
        if origin is not None and checked and (host is None or _netloc(origin) != host.lower()):
            return 403, _foreign(method, origin), {}
        path = conn.url.path
        guarded = path.startswith("/api/") and path not in OPEN_API
        guarded = guarded or path == METRICS_PATH and not self.metrics_public
        if self.users is not None and guarded:
            token = bearer_or_cookie(conn)
            if token_owner(self.users, token) is None:
                return 401, unauthorized(bool(token)), {"WWW-Authenticate": "Bearer"}
        return None


def unauthorized(token_given: bool) -> str:
    message = "send Authorization: Bearer <token> (the token `sandcell serve` printed)"
    if token_given:
        return "that token is not one of this server's; " + message
    return message


def _netloc(origin: str) -> str | None:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return None
    return parts.netloc.lower() if parts.scheme in ("http", "https") else None


def _bad_host(host: str, name: str | None) -> str:
    shown = name or host
    return (
        f"this server does not answer to the name {shown!r} (Host header; a guard against DNS "
        f"rebinding); open it by the address it listens on, or start it with "
        f"--allowed-host {shown}"
    )


def _foreign(method: str, origin: str) -> str:
    return (
        f"a {method} from another site ({origin}) is refused; "
        "only this server's own page may send it"
    )


async def send_error(send: Send, status: int, message: str, headers: dict | None = None) -> None:
    """A JSON `{"error": ...}` answer, as the app's own errors are."""
    body = json.dumps({"error": message}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
