"""A deadline on a whole HTTP request, not between its bytes.

httpx's read timeout holds between two reads: a server that keeps a stream alive with SSE
pings (llama-cpp-python's, queued behind an earlier request, pings every 15 s) or trickles
bytes never trips it. `RequestDeadline` is a timer, independent of bytes arriving: at the
deadline it shuts down the socket of every response it watches, which wakes the thread
blocked reading it at once (closing the socket would not wake a blocked read on Linux).
Before a response exists (the request is sent, no headers yet) the read timeout, cut to the
time left, is the bound: nothing is read then, so nothing resets it."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any


class RequestDeadline:
    """`with RequestDeadline(deadline) as limit:` then `limit.watch(http_response)` once the
    response's headers are in. `limit.fired` says the deadline ended the request."""

    def __init__(self, deadline: float | None):
        self.deadline, self.fired = deadline, False
        self.chunks = 0  # reply chunks read so far, for the message that says what came
        self.answered = False  # the request under way has its response's headers
        self._responses: list[Any] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __enter__(self) -> RequestDeadline:
        if self.deadline is not None:
            self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(
        self, kind: type | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def begin(self) -> None:
        """A new request under the same deadline (a fallback): nothing of it has come yet."""
        self.chunks, self.answered = 0, False

    def watch(self, response: Any) -> None:
        """An httpx response (httpx or the openai client's httpx2) to end at the deadline."""
        with self._lock:
            self._responses.append(response)
            self.answered, fired = True, self.fired
        if fired:  # the deadline came while its headers were on their way
            _shut(response)

    def _fire(self) -> None:
        left = (self.deadline or 0.0) - time.monotonic()
        if left > 0:  # a timer may wake a little early: the deadline is a promise both ways
            time.sleep(left)
        with self._lock:
            self.fired = True
            responses = list(self._responses)
        for response in responses:
            _shut(response)


def _shut(response: Any) -> None:
    """Shut down the response's socket (both ways): the reader gets end-of-file or an error at
    once. The socket itself is closed by its owner, as usual."""
    stream = getattr(response, "extensions", {}).get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the raw socket's, under any TLS
        except OSError:  # closed already: nothing is being read from it
            pass
        return
    response.close()  # another transport: the best it offers
