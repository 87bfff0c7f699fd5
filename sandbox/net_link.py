"""The host's end of `--allow-net` over the stream transport: no folder is shared with the
engine, so the proxy's socket cannot be mounted. Instead the host keeps WAITING `docker exec`s
of the forwarder's pipe (images/net_forwarder.py `--pipe`, as the bridge's uid) at the
forwarder's dock in the container. A client's connection takes one: its first bytes arrive
here, and only then is the host's proxy (sandbox/net_proxy.py, the same as over ipc) reached
and the bytes carried both ways, each exec a stream of its own (one connection's slowness holds
no other back); a new pipe takes its place at the dock. What comes back from an exec is
untrusted bytes, as any client's: the proxy reads it as it reads the ipc transport's.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import requests
from docker.models.containers import Container

from sandcell.sandbox import boundary
from sandcell.sandbox.container import BRIDGE_USER, exec_frames, upgraded_stream
from sandcell.sandbox.stream import keep_alive

log = logging.getLogger(__name__)
WAITING = 2  # pipes at the dock; a connection's own starts the next (the forwarder waits 10 s)
CHUNK = 64 << 10
RETRY_S = 0.25  # a pipe that ended unused (a forwarder restarted) is started again after 2x this,
RETRY_MAX_S = 10.0  # doubling while they keep failing (a forwarder model code keeps killing)
PIPE = ["python3", boundary.NET_PROGRAM, "--pipe", boundary.NET_SOCKET]


class NetLink:
    """The pipes of one streamed sandbox's container to its proxy listening at `proxy`."""

    def __init__(self, container: Container, proxy: Path):
        self.container, self.proxy = container, proxy
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # every exec's socket, closed by close()

    def open(self) -> None:
        for _ in range(WAITING):
            self._next()

    def close(self) -> None:
        """Every pipe ended (its exec's stdin closed, its connection with it)."""
        self._closed.set()
        with self._lock:
            opened, self._open = self._open, set()
        for sock in opened:
            _shut(sock)

    def _next(self) -> None:
        threading.Thread(target=self._wait, daemon=True, name="net-pipe").start()

    def _wait(self) -> None:
        """One pipe at the dock until a connection takes it, then that connection carried.
        A pipe that ends unused (a forwarder restarted), or an engine that does not answer,
        is tried again, ever more slowly while it keeps failing; a stopped container ends it."""
        failures = 0
        while not self._closed.is_set():
            started = self._start()
            frames = exec_frames(started[1]) if started is not None else None
            first = _first_bytes(frames) if frames is not None else None
            if started is not None and frames is not None and first is not None:
                self._next()  # its place at the dock
                try:
                    self._carry(started[0], first, frames)  # one reader: it holds what it read
                finally:
                    self._forget(*started)
                return
            if started is not None:
                self._forget(*started)
            if not self._running():
                return  # the container is gone (or going): so is the need
            failures += 1
            self._closed.wait(min(RETRY_S * 2 ** min(failures, 8), RETRY_MAX_S))

    def _running(self) -> bool:
        """Whether the container may still take a pipe (an engine that does not answer: yes,
        it may again)."""
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return False
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return True
        return self.container.status == "running"

    def _start(self) -> tuple[socket.socket, Any] | None:
        """A pipe's exec started: its socket, and its output as read through the response's
        reader (container.upgraded_stream); None when it could not be (or the link closed)."""
        api = self.container.client.api
        try:
            exec_id = api.exec_create(self.container.id, PIPE, stdin=True, user=BRIDGE_USER)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except (docker.errors.APIError, requests.exceptions.RequestException) as error:
            log.debug("no net pipe: %s", error)
            return None
        raw: socket.socket = getattr(sock, "_sock", sock)
        raw.settimeout(None)  # a pipe may wait at the dock for hours
        keep_alive(raw)
        with self._lock:
            if self._closed.is_set():
                _shut(raw)
                return None
            self._open.add(raw)
        return raw, upgraded_stream(sock)

    def _forget(self, raw: socket.socket, stream: Any) -> None:
        with self._lock:
            self._open.discard(raw)
        _shut(raw)
        stream.close()  # it holds the socket open (makefile's reference) until then
        raw.close()

    def _carry(self, raw: socket.socket, first: bytes, frames: Iterator[tuple[int, bytes]]) -> None:
        """The client's bytes (the exec's stdout) to the proxy, the proxy's to its stdin; the
        exec's end is the client's (the pipe ends when it does): the proxy connection closes."""
        with socket.socket(socket.AF_UNIX) as proxy:
            try:
                proxy.connect(str(self.proxy))
                proxy.sendall(first)
            except OSError:
                return  # the proxy is closed: the sandbox is closing or renewing
            back = threading.Thread(target=_to_exec, args=(proxy, raw), daemon=True)
            back.start()
            try:
                for stream_id, payload in frames:
                    if stream_id == 1:
                        proxy.sendall(payload)
            except (OSError, ValueError):
                pass  # either side gone
            finally:
                _shut(proxy)
            back.join()


def _first_bytes(frames: Iterator[tuple[int, bytes]]) -> bytes | None:
    """The first stdout bytes of a pipe (a client has come), or None if it ended first."""
    try:
        for stream_id, payload in frames:
            if stream_id == 1 and payload:
                return payload
    except (OSError, ValueError):
        pass
    return None


def _to_exec(proxy: socket.socket, raw: socket.socket) -> None:
    """The proxy's bytes into the exec's stdin; at their end, the end of its stdin."""
    try:
        while data := proxy.recv(CHUNK):
            raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _shut(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
