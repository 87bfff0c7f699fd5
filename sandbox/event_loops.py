"""The event loops jupyter_client makes for its blocking calls, closed at exit.

Its BlockingKernelClient runs each call on an asyncio loop of the calling thread, which
jupyter_core creates on first use and never closes. A front end that calls sandboxes from
worker threads (serve, MCP) leaves one per thread; the garbage collector then closes them at
interpreter exit, after their sockets, and prints "Exception ignored in
BaseEventLoop.__del__ ... Invalid file descriptor: -1" over a clean shutdown. Each loop made
is noted here and the idle ones are closed by an atexit handler, before that teardown.

Installed at the first kernel connection, not at import: `import sandcell` changes nothing in
the importing program, and a program that set a policy of its own (uvloop's, say) keeps it."""

import asyncio
import atexit
import threading
import weakref

_made: "weakref.WeakSet[asyncio.AbstractEventLoop]" = weakref.WeakSet()
_installing = threading.Lock()  # sandboxes connect from several threads at once


class _NotingPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        loop = super().new_event_loop()
        _made.add(loop)
        return loop


def close_idle_loops() -> None:
    for loop in list(_made):
        if not loop.is_running() and not loop.is_closed():
            loop.close()


def install() -> None:
    """Before each kernel client (sandbox.kernel.connect): the first call in a process puts
    the noting policy in place of asyncio's default one; any other policy is left alone."""
    with _installing:
        if type(asyncio.get_event_loop_policy()) is asyncio.DefaultEventLoopPolicy:
            asyncio.set_event_loop_policy(_NotingPolicy())
            atexit.register(close_idle_loops)
