"""The host's end of `--allow-net` over the stream transport: no folder is shared with the
engine, so the proxy's socket cannot be mounted. Instead the host keeps WAITING `docker exec`s
of the forwarder's pipe (images/net_forwarder.py `--pipe`, as the bridge's uid) at the
forwarder's dock in the container. A client's connection takes one, which says TAKEN; then a
new pipe takes its place at the dock, the host's proxy (sandbox/net_proxy.py, the same as over
ipc) is reached and the bytes are carried both ways, each connection an exec stream of its own
(one connection's slowness holds no other back). The dock is a socket of model code's uid:
what comes back from an exec is untrusted bytes, as any client's, and at most MOST pipes live.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import requests
from docker.models.containers import Container

from sandcell.sandbox import boundary
from sandcell.sandbox.container import BRIDGE_USER, exec_frames, exec_stream

log = logging.getLogger(__name__)
WAITING = 2  # pipes at the dock; a connection's TAKEN starts the next (the forwarder waits 10 s)
MOST = 16  # pipes at once, waiting and carrying: the forwarder carries no more either
CHUNK = 64 << 10
TAKEN = b"\x01"  # the dock's first byte to a pipe it gives a client (net_forwarder.TAKEN)
RETRY_S = 0.25  # a pipe that ends unused is started again after 2x this, doubling while they
RETRY_MAX_S = 5.0  # keep failing (a forwarder model code keeps killing), up to this
SETTLED_S = 5.0  # an unused pipe that lived this long had reached the dock: no failure
PIPE = ["python3", boundary.NET_PROGRAM, "--pipe", boundary.NET_SOCKET]


class NetLink:
    """The pipes of one streamed sandbox's container to its proxy listening at `proxy`."""

    def __init__(self, container: Container, proxy: Path):
        self.container, self.proxy = container, proxy
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # every exec's socket, closed by close()
        self._waiting = 0  # pipes started and not yet taken
        self._carrying = 0

    def open(self) -> None:
        self._refill()

    def close(self) -> None:
        """Every pipe ended (its exec's stdin closed, its connection with it)."""
        self._closed.set()
        with self._lock:
            opened, self._open = self._open, set()
        for sock in opened:
            _shut(sock)

    def _refill(self) -> None:
        """Pipes started until WAITING wait at the dock, within MOST."""
        with self._lock:
            wanted = min(WAITING - self._waiting, MOST - self._waiting - self._carrying)
            wanted = 0 if self._closed.is_set() else max(wanted, 0)
            self._waiting += wanted
        for _ in range(wanted):
            threading.Thread(target=self._pipe, daemon=True, name="net-pipe").start()

    def _pipe(self) -> None:
        """One pipe at the dock until a connection takes it, then that connection carried.
        A pipe that ends unused (a forwarder restarted), or an engine that does not answer,
        is tried again, more slowly while they keep failing; a stopped container ends it."""
        failures, taken = 0, False
        try:
            while not self._closed.is_set():
                started, since = self._start(), time.monotonic()
                if started is not None:
                    raw, stream = started
                    frames = exec_frames(stream)  # one reader: it holds what it has read
                    try:
                        first = _first_bytes(frames)
                        if first is not None and first[:1] == TAKEN:
                            taken = True
                            self._taken()
                            self._carry(raw, first[1:], frames)
                            return
                    finally:
                        self._forget(raw, stream)
                if not self._running():
                    self._closed.set()  # the container is gone (or going): so is the need
                    return
                settled = started is not None and time.monotonic() - since > SETTLED_S
                failures = 0 if settled else failures + 1
                self._closed.wait(min(RETRY_S * 2**failures, RETRY_MAX_S))
        finally:
            with self._lock:
                if taken:
                    self._carrying -= 1
                else:
                    self._waiting -= 1
            self._refill()

    def _taken(self) -> None:
        with self._lock:
            self._waiting -= 1
            self._carrying += 1
        self._refill()  # its place at the dock

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
        """A pipe's exec (container.exec_stream); None when it could not be started, or the
        link closed meanwhile."""
        try:
            raw, stream = exec_stream(self.container, PIPE, BRIDGE_USER)
        except (docker.errors.APIError, requests.exceptions.RequestException) as error:
            log.debug("no net pipe: %s", error)
            return None
        with self._lock:
            if not self._closed.is_set():
                self._open.add(raw)
                return raw, stream
        _shut(raw)
        stream.close()
        raw.close()
        return None

    def _forget(self, raw: socket.socket, stream: Any) -> None:
        with self._lock:
            self._open.discard(raw)
        _shut(raw)
        stream.close()  # it holds the socket open (makefile's reference) until then
        raw.close()

    def _carry(self, raw: socket.socket, first: bytes, frames: Iterator[tuple[int, bytes]]) -> None:
        """The client's bytes (the exec's stdout) to the proxy, the proxy's to its stdin.
        When the client sends no more, the pipe says on stderr how many bytes its stdout
        carried in all: once they are here the proxy hears the same. The exec's end is the
        pipe's: both ways are over."""
        with socket.socket(socket.AF_UNIX) as proxy:
            try:
                proxy.connect(str(self.proxy))
                proxy.sendall(first)
            except OSError:
                return  # the proxy is closed: the sandbox is closing or renewing
            back = threading.Thread(target=_to_exec, args=(proxy, raw), daemon=True)
            back.start()
            carried, said, total = 1 + len(first), b"", None  # TAKEN, then the client's
            half_closed = False
            try:
                for stream_id, payload in frames:
                    if stream_id == 1:
                        proxy.sendall(payload)
                        carried += len(payload)
                    elif total is None:
                        said = (said + payload)[:24]  # a count and a newline; past it, noise
                        total = _count(said)
                    if total is not None and carried >= total and not half_closed:
                        proxy.shutdown(socket.SHUT_WR)
                        half_closed = True
            except (OSError, ValueError):
                pass  # either side gone
            finally:
                _shut(proxy)
                _shut(raw)  # a write into a stdin nobody reads ends too
            back.join()


def _count(said: bytes) -> int | None:
    """The pipe's count of what its stdout carried, once its line is whole (a line that is
    no count: the end of what comes, now)."""
    line, newline, _ = said.partition(b"\n")
    if not newline:
        return None if len(said) < 24 else 0
    return int(line) if line.isdigit() else 0


def _first_bytes(frames: Iterator[tuple[int, bytes]]) -> bytes | None:
    """The first stdout bytes of a pipe (the dock's TAKEN first), or None if it ended first."""
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
