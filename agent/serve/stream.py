"""One question as server-sent events: `Session.ask` runs in a thread of its own, each of its
events becomes one SSE event as it happens (token, thought, action, output: a running cell's
stdout/stderr, observation, warning), and the stream ends with `answer` (or `error`) once the
answer, the notebook and the files are in place."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import nh3

from agent import events as ev
from agent import stops
from agent.seams import Result
from sandbox.execution import Execution

if TYPE_CHECKING:
    from agent.serve.served import ServedSession

log = logging.getLogger(__name__)

# Table HTML (a DataFrame's) keeps its structure and nothing that could run or restyle the page.
TABLE_TAGS = {"table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "colgroup", "col"}
TABLE_TAGS |= {"div", "span", "p", "br", "b", "i", "em", "strong", "code", "pre", "small"}
TABLE_ATTRIBUTES = {"th": {"colspan", "rowspan"}, "td": {"colspan", "rowspan"}}
MAX_TABLE_HTML = 256 << 10  # pandas caps its own HTML; this caps a hand-made display
FAILED = (stops.MODEL_ERROR, stops.SANDBOX_ERROR)


def table_html(html: str) -> str:
    return nh3.clean(html[:MAX_TABLE_HTML], tags=TABLE_TAGS, attributes=TABLE_ATTRIBUTES)


def execution_summary(ex: Execution) -> dict:
    error = {"name": ex.error.name, "value": ex.error.value} if ex.error else None
    return {
        "execution_count": ex.execution_count,
        "duration_s": round(ex.duration_s, 3),
        "timed_out": ex.timed_out,
        "interrupted": ex.interrupted,
        "restarted": ex.restarted,
        "error": error,
    }


def final(result: Result, served: ServedSession) -> dict:
    return {
        "answer": result.answer,
        "stop_reason": result.stop_reason,
        "steps": result.steps,
        "detail": result.detail,
        "error": result.error,
        "warnings": result.warnings,
        "files": [served.url_of(path) for path in result.files],
        "notebook": f"{served.url}/notebook",
    }


class MessageStream:
    """Started at once (the caller holds the session's one-message claim, released here when
    the question ends); `events()` yields what happened, as it happened."""

    def __init__(self, served: ServedSession, content: str, warning: str | None):
        self.served, self.content = served, content
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, dict] | None] = asyncio.Queue()
        self.finished = threading.Event()
        if warning:
            self._on_event(ev.Notice(text=warning, kernel_reset=True))
        served.sink = self._on_event
        threading.Thread(target=self._work, daemon=True, name=f"question-{served.id}").start()

    def _put(self, kind: str | None, data: dict | None = None) -> None:
        item = None if kind is None else (kind, data or {})
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the server's loop is gone (shutting down): nobody listens
            pass

    def _on_event(self, event: ev.Event) -> None:
        """Runs in the question's thread, beside the kernel: figures are copied here. Each
        event the page shows becomes the SSE event it reads (page.js); the answer is sent
        from the Result, once the files are in place, and the trace's own records not."""
        match event:
            case ev.Token(text=text):
                self._put("token", {"text": text})
            case ev.Thought(text=text):
                self._put("thought", {"text": text})
            case ev.ActionStarted(tool=tool, args=args):
                self._put("action", {"tool": tool, "args": args})
            case ev.Output(name=name, text=text):
                self._put("output", {"name": name, "text": text})
            case ev.Observation():
                self._put("observation", self._observation(event))
            case ev.Notice(text=text, kernel_reset=True):
                self._put("warning", {"text": text, "kernel_reset": True})
            case ev.Notice(text=text) | ev.ProtocolChanged(text=text) | ev.VisionOff(text=text):
                self._put("warning", {"text": text})

    def _observation(self, event: ev.Observation) -> dict:
        out = {"tool": event.tool, "ok": event.ok, "text": event.text}
        ex = event.execution
        if ex is not None:
            out["figures"] = self.served.save_figures(ex)
            out["tables"] = [
                table_html(r.data["text/html"]) for r in ex.results if "text/html" in r.data
            ]
            out["execution"] = execution_summary(ex)
        return out

    def _work(self) -> None:
        served = self.served
        try:
            result = served.ask(self.content)
            kind = "error" if result.stop_reason in FAILED and result.answer is None else "answer"
            payload = final(result, served)
        except Exception as exc:  # a bug: the stream still ends, saying what broke
            log.exception("question %s of session %s failed", self.content[:60], served.id)
            kind = "error"
            payload = {"answer": None, "stop_reason": "error", "steps": 0, "error": repr(exc)}
        finally:
            served.sink = None
            self.finished.set()
            served.done()  # before the last event: the client may send the next message at once
        self._put(kind, payload)
        self._put(None)

    async def events(self) -> AsyncIterator[dict]:
        try:
            while (item := await self._queue.get()) is not None:
                kind, data = item
                yield {"event": kind, "data": json.dumps(data, ensure_ascii=False, default=str)}
        finally:
            if not self.finished.is_set():  # the client went away: stop the question too
                self.served.sink = None
                # the interrupt goes through the kernel client: not on the event loop
                threading.Thread(target=self.served.cancel, daemon=True).start()
