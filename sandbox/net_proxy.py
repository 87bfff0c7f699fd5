"""The host's proxy for one sandbox's connections (`--allow-net`): the only way out of a sandbox
that has an allowlist, since its container still has no network interface.

It listens on a Unix socket (the container's forwarder carries each connection to it) and
takes `CONNECT host:port` (TLS stays end to end: it never sees plaintext) or an absolute-URL
HTTP request. It matches the name against the allowlist, resolves it once on the host, refuses
addresses the sandbox may not reach (allowlist.refused_address) unless the entry is internal,
and connects to the very address it checked: a second lookup could answer otherwise (DNS
rebinding). A refusal is an HTTP error whose reason phrase says why in one line, which urllib,
requests and pandas put in their errors. Connections at once, bytes in all, connect and idle
times are capped. Each connection ends as a ConnectionRecord record given to `on_connection`.

Written on asyncio rather than with a proxy library: the decision has to come after the
host's own lookup and the connection has to go to the address that was checked, and the
proxies on PyPI resolve and connect by name themselves. One event loop thread serves every
proxy of the process."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sandcell.sandbox.allowlist import (
    Allowlist,
    HostEntry,
    is_address,
    normal,
    refused_address,
    valid_host,
)

HEAD_BYTES = 16 << 10  # a request's line and headers, at most
CHUNK = 64 << 10
REASON_CHARS = 300

Resolver = Callable[[str, int], Awaitable[list[str]]]
T = TypeVar("T")


@dataclass(frozen=True)
class NetLimits:
    connections: int = 8  # at once
    total_bytes: int = 100 << 20  # both ways, all connections of the sandbox (--net-mb)
    connect_s: float = 10.0  # the request's head, and the connection to the host
    idle_s: float = 60.0  # without a byte either way


@dataclass
class ConnectionRecord:
    """One connection a sandbox asked for: where, how much, and whether it was let through."""

    host: str
    port: int
    address: str | None = None  # the address it went to (the one checked)
    sent: int = 0  # bytes from the sandbox to the host
    received: int = 0
    allowed: bool = False
    reason: str = ""  # why it was refused or cut; "" when it ended normally


class ProxyRefusal(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's lookup of a checked name: as a full name first (a trailing dot), so that no
    search domain (Kubernetes' ndots:5) answers for a name DNS has; then, only where that name
    is unknown, as written, which the hosts file answers (glibc's reads no name with a trailing
    dot). Either way the addresses are judged after."""
    loop = asyncio.get_running_loop()
    if not is_address(host):
        try:
            infos = await loop.getaddrinfo(f"{host}.", port, type=socket.SOCK_STREAM)
            return [str(info[4][0]) for info in infos]
        except socket.gaierror as error:
            if error.errno != socket.EAI_NONAME:  # DNS not answering: no search domain either
                raise
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class NetProxy:
    """The proxy of one sandbox, listening at `path` until `close()`."""

    def __init__(
        self,
        allowlist: Allowlist,
        path: Path,
        limits: NetLimits = NetLimits(),
        on_connection: Callable[[ConnectionRecord], None] | None = None,
        resolver: Resolver = system_resolver,
    ):
        self.allowlist, self.path, self.limits = allowlist, Path(path), limits
        self.on_connection, self.resolver = on_connection, resolver
        self.used = 0  # bytes both ways, all connections
        self._open: set[asyncio.Task] = set()
        self._server: asyncio.AbstractServer | None = None
        self._closed = False  # a connection accepted as close() ran is ended at once

    def start(self) -> NetProxy:
        self._closed = False
        self._server = _run(asyncio.start_unix_server(self._handle, self.path, limit=HEAD_BYTES))
        return self

    def close(self) -> None:
        """Stop listening and end every open connection (a renewed sandbox keeps none)."""
        if self._server is not None:
            server, self._server = self._server, None
            _run(self._stop(server))

    def settle(self, timeout: float) -> None:
        """Wait, at most `timeout`, for the open connections to end: those a cell closed as it
        ended are recorded with it (their ends take a moment to come through the forwarder)."""
        deadline = time.monotonic() + timeout
        while self._open and time.monotonic() < deadline:
            time.sleep(0.005)

    async def _stop(self, server: asyncio.AbstractServer) -> None:
        self._closed = True
        server.close()
        for task in list(self._open):
            task.cancel()
        await asyncio.gather(*self._open, return_exceptions=True)
        with contextlib.suppress(OSError):
            self.path.unlink()

    # -- one connection ----------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed or len(self._open) >= self.limits.connections:
            # before its request is read: connections that send nothing hold no slot either
            await _answer(writer, 503, f"too many connections at once ({self.limits.connections})")
            with contextlib.suppress(OSError, TimeoutError):  # what it sent, read briefly, so
                await asyncio.wait_for(reader.read(HEAD_BYTES), 0.5)  # the close is no reset
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        record = ConnectionRecord("", 0)
        try:
            await self._serve(reader, writer, record)
        except ProxyRefusal as refusal:
            record.reason = refusal.reason
            await _answer(writer, refusal.status, refusal.reason)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            record.reason = record.reason or "the sandbox's side closed or sent a bad request"
        except asyncio.CancelledError:  # close(): the sandbox is going
            record.reason = record.reason or "the sandbox was closed"
        finally:
            self._open.discard(task)
            record.reason = record.reason[:REASON_CHARS]
            if record.host and self.on_connection is not None:
                self.on_connection(record)  # before the sandbox sees the end of it
            writer.close()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: ConnectionRecord
    ) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.connect_s)
        method, target, lines = _request(head)
        tunnel = method == "CONNECT"
        record.host, record.port, path = _target(method, target)
        entry = self.allowlist.entry_for(record.host, record.port)
        if entry is None:
            raise ProxyRefusal(403, f"not allowed: {record.host}:{record.port}; this sandbox may "
                               f"reach: {self.allowlist}")  # fmt: skip
        if self.used >= self.limits.total_bytes:
            raise ProxyRefusal(403, f"this sandbox's {self._cap_mb()} MB of network are used up")
        up_reader, up_writer = await self._connect(record, entry)
        record.allowed = True
        try:
            if tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                request = _origin_form(method, path, lines)
                record.sent += len(request)
                self.used += len(request)
                up_writer.write(request)
            await self._pipe(reader, writer, up_reader, up_writer, record)
        finally:
            up_writer.close()

    async def _connect(
        self, record: ConnectionRecord, entry: HostEntry
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to one of the addresses the one lookup gave that the sandbox may
        reach, tried in their order (no second lookup)."""
        host, port = record.host, record.port
        tried = []
        for address in await self._checked(host, port, entry):
            record.address = address
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port), self.limits.connect_s
                )
            except (OSError, TimeoutError) as error:
                tried.append(f"{address}: {error or type(error).__name__}")
        raise ProxyRefusal(502, f"{host}:{port} did not answer ({'; '.join(tried)})")

    async def _checked(self, host: str, port: int, entry: HostEntry) -> list[str]:
        """The addresses one lookup gave that the sandbox may reach (ProxyRefusal: none)."""
        try:
            answers = await asyncio.wait_for(self.resolver(host, port), self.limits.connect_s)
        except (OSError, TimeoutError) as error:
            raise ProxyRefusal(502, f"{host} does not resolve: {error or 'timed out'}") from None
        allowed, reasons = [], []
        for answer in answers[:16]:
            address = ipaddress.ip_address(answer.split("%")[0])
            why = None if entry.internal else refused_address(address)
            if why is None:
                allowed.append(str(address))
            else:
                reasons.append(f"{address} is {why}")
        if allowed:
            return list(dict.fromkeys(allowed))
        detail = "; ".join(reasons) or "no address"
        raise ProxyRefusal(403, f"not allowed: {host} resolves to {detail}; name it as "
                           f"internal:{host}:{port} to reach it")  # fmt: skip

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        record: ConnectionRecord,
    ) -> None:
        loop = asyncio.get_running_loop()
        last = [loop.time()]  # a byte either way, or a write taken: the connection is alive

        async def copy(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, field: str
        ) -> None:
            while data := await source.read(CHUNK):
                last[0] = loop.time()
                if self.used + len(data) > self.limits.total_bytes:
                    record.reason = f"cut at this sandbox's {self._cap_mb()} MB of network"
                    return
                self.used += len(data)
                setattr(record, field, getattr(record, field) + len(data))
                sink.write(data)
                await sink.drain()  # a side that never reads stops here: the watchdog ends it
                last[0] = loop.time()
            if field == "sent" and sink.can_write_eof():  # the sandbox is done sending
                sink.write_eof()

        async def watchdog() -> None:
            while loop.time() - last[0] < self.limits.idle_s:
                await asyncio.sleep(min(1.0, self.limits.idle_s / 4))
            record.reason = f"idle for {self.limits.idle_s:g} s"

        sent = asyncio.create_task(copy(reader, up_writer, "sent"))
        received = asyncio.create_task(copy(up_reader, writer, "received"))
        idle = asyncio.create_task(watchdog())
        try:
            done, _ = await asyncio.wait(
                {sent, received, idle}, return_when=asyncio.FIRST_COMPLETED
            )
            if done == {sent} and not record.reason:  # hear the host out, as long as it talks
                await asyncio.wait({received, idle}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sent, received, idle):
                task.cancel()
            await asyncio.gather(sent, received, idle, return_exceptions=True)

    def _cap_mb(self) -> str:
        return f"{self.limits.total_bytes / (1 << 20):g}"


def _request(head: bytes) -> tuple[str, str, list[str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ProxyRefusal(400, "not an HTTP proxy request")
    return parts[0].upper(), parts[1], [line for line in lines[1:] if line]


def _target(method: str, target: str) -> tuple[str, int, str]:
    """host, port and (for plain HTTP) the path of the request's target."""
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ProxyRefusal(400, f"CONNECT needs host:port, got {target[:100]!r}")
        return _host(host.strip("[]")), int(port), ""
    url = urlsplit(target)
    try:
        port_given = url.port
    except ValueError:
        raise ProxyRefusal(400, "the URL's port is not a number from 1 to 65535") from None
    if url.scheme != "http" or not url.hostname:
        raise ProxyRefusal(400, "only CONNECT or an absolute http:// URL go through this proxy")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    return _host(url.hostname), port_given or 80, path


def _host(name: str) -> str:
    """A host name of letters, digits, hyphens and dots, or an IP address: nothing a resolver
    could read otherwise (a NUL ends a name for getaddrinfo, `%` names an interface)."""
    host = normal(name)
    if name != name.strip() or not valid_host(host):
        raise ProxyRefusal(400, f"not a host name or an IP address: {name[:100]!r}")
    return host


def _origin_form(method: str, path: str, lines: list[str]) -> bytes:
    """The request as the host expects it: its path only, no proxy headers, one request."""
    kept = [
        line for line in lines
        if line.split(":", 1)[0].strip().lower() not in ("proxy-connection", "proxy-authorization", "connection")
    ]  # fmt: skip
    return "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""]).encode(
        "latin-1"
    )


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    phrase = "".join(c if " " <= c <= "~" else "?" for c in reason)[:REASON_CHARS]
    body = f"{phrase}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
        + body
    )
    with contextlib.suppress(OSError):
        await writer.drain()


# -- the proxies' event loop -----------------------------------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_starting = threading.Lock()


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the proxies' loop (started on first use) and wait for its result."""
    global _loop
    with _starting:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="net-proxy", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coroutine, _loop).result(30)
