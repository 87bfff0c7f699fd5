"""A deadline on a whole HTTP request, not between its bytes.

httpx's read timeout holds between two reads: a server that keeps a stream alive with SSE
pings (llama-cpp-python's, queued behind an earlier request, pings every 15 s) or trickles
bytes never trips it. `RequestDeadline` is a timer, independent of bytes arriving: at the
deadline (or once the caller cancels) it shuts down the socket of every response it watches, which wakes the thread
blocked reading it at once (closing the socket would not wake a blocked read on Linux).
Before a response exists (the request is sent, no headers yet) the read timeout, cut to the
time left, is the bound: nothing is read then, so nothing resets it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

POLL_S = 0.2  # how often a cancel from another thread is looked for
# a read timeout cut to the time left may wake this much before the deadline (timer rounding)
EARLY_S = 0.05


class RequestDeadline:
    """`with RequestDeadline(deadline, cancelled) as limit:` then `limit.watch(http_response)`
    once the response's headers are in. `limit.fired` says what ended the request: "deadline",
    "cancelled" (the caller's `cancelled()` turned true: a Stop button, Ctrl-C), or "" (not
    ended by this)."""

    def __init__(self, deadline: float | None, cancelled: Callable[[], bool] | None = None):
        self.deadline, self.cancelled, self.fired = deadline, cancelled, ""
        self.chunks = 0  # reply chunks read so far, for the message that says what came
        self.answered = False  # the request under way has its response's headers
        self._responses: list[Any] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RequestDeadline:
        if self.deadline is not None or self.cancelled is not None:
            self._thread = threading.Thread(target=self._wait, daemon=True, name="deadline")
            self._thread.start()
        return self

    def __exit__(
        self, kind: type | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:  # a response back in the pool after this is not shut down
            self._done.set()

    def begin(self) -> None:
        """A new request under the same deadline (a fallback): nothing of it has come yet, and
        the last one's connection is closed or back in the pool, not to be shut down."""
        with self._lock:
            self.chunks, self.answered, self._responses = 0, False, []

    def watch(self, response: Any) -> None:
        """An httpx response (httpx or the openai client's httpx2) to end at the deadline."""
        with self._lock:
            self._responses.append(response)
            self.answered, fired = True, self.fired
        if fired:  # the deadline came while its headers were on their way
            _shut(response)

    def ended(self) -> str:
        """What ended the request: what the timer fired for, or "deadline" once the deadline
        has passed though the timer has not run yet. On a loaded machine the read timeout, cut
        to the time left, can trip before the timer's thread is scheduled; it is the deadline's
        doing all the same."""
        if self.fired or self.deadline is None:
            return self.fired
        return "deadline" if time.monotonic() >= self.deadline - EARLY_S else ""

    def _wait(self) -> None:
        while True:
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is not None and left <= 0:
                return self._fire("deadline")
            if self.cancelled is not None and self.cancelled():
                return self._fire("cancelled")
            wait = left if self.cancelled is None else min(POLL_S, left or POLL_S)
            if self._done.wait(wait):
                return  # the request ended first

    def _fire(self, why: str) -> None:
        with self._lock:
            if self._done.is_set():  # the request ended just now, on its own
                return
            self.fired = why
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
