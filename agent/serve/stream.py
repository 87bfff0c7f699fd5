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
from urllib.parse import quote, unquote, urlsplit

import nh3
from markdown_it import MarkdownIt
from markdown_it.token import Token

from sandcell.agent import events as ev
from sandcell.agent import stops
from sandcell.agent.seams import RunResult
from sandcell.agent.serve.files import INPUTS_DIR, parts_of
from sandcell.agent.session import collected_place
from sandcell.sandbox.boundary import DATA, WORKSPACE
from sandcell.sandbox.execution import Execution
from sandcell.sandbox.render import IMAGE_TYPES, parts

if TYPE_CHECKING:
    from sandcell.agent.serve.served import ServedSession

log = logging.getLogger(__name__)

# Table HTML (a DataFrame's) keeps its structure and nothing that could run or restyle the page.
TABLE_TAGS = {"table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "colgroup", "col"}
TABLE_TAGS |= {"div", "span", "p", "br", "b", "i", "em", "strong", "code", "pre", "small"}
TABLE_ATTRIBUTES = {"th": {"colspan", "rowspan"}, "td": {"colspan", "rowspan"}}
MAX_TABLE_HTML = 256 << 10  # pandas caps its own HTML; this caps a hand-made display
FAILED = (stops.MODEL_ERROR, stops.SANDBOX_ERROR)


def table_html(html: str) -> str:
    return nh3.clean(html[:MAX_TABLE_HTML], tags=TABLE_TAGS, attributes=TABLE_ATTRIBUTES)


def shown(ex: Execution) -> dict:
    """What the page shows of a cell, each output once: `output` (the stream, which the page
    has shown live already), `results` as text, `tables` (a result with an HTML table is shown
    as the table alone) with `table_data` beside them (one each: a DataFrame's rows, which the
    page draws as a sortable table instead of the HTML, or null), the compact `error`, and
    `notes`. The model's text is `text`."""
    p = parts(ex)
    results, tables, table_data = [], [], []
    for result, text in zip(ex.results, p.results, strict=True):
        html = result.data.get("text/html")
        if html is not None:
            tables.append(table_html(html))
            table_data.append(result.table)
            if "<table" in html.lower():
                continue  # its text form is the model's; a person reads the table
        if not any(kind in result.data for kind in IMAGE_TYPES):  # charts: `figures`
            results.append(text)
    return {"output": p.stream, "results": results, "tables": tables, "table_data": table_data,
            "error": p.error, "notes": p.notes}  # fmt: skip


# An answer is Markdown: CommonMark and tables, no raw HTML (a `<script>` in it is text), then
# nh3 keeps the tags Markdown makes and links to http(s) or the session's own files only.
MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
ANSWER_TAGS = TABLE_TAGS | {"h1", "h2", "h3", "h4", "h5", "h6", "hr", "blockquote", "s", "a"}
ANSWER_TAGS |= {"ul", "ol", "li", "img"}
ANSWER_ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "ol": {"start"}}
ALIGNED = {f"align-{side}" for side in ("left", "center", "right")}  # CSP forbids style=""
# characters rendered (the plain answer keeps them all): a hostile 64 KiB renders in < 1 s
MAX_ANSWER_MARKDOWN = 64 << 10


def answer_html(text: str, session_url: str) -> str:
    """The answer as sanitised HTML for the page; links and images that name a file of the
    session (`output/x.csv`, `/workspace/...`, `/data/...`) point at its download route."""
    tokens = MARKDOWN.parse(text[:MAX_ANSWER_MARKDOWN])
    for token in tokens:
        _align_by_class(token)
        if token.children:
            token.children = [t for c in token.children for t in _local_image(c, session_url)]
    html = MARKDOWN.renderer.render(tokens, MARKDOWN.options, {})
    if len(text) > MAX_ANSWER_MARKDOWN:
        html += "<p><em>(the answer goes on: its full text is in the notebook)</em></p>"

    def confine(tag: str, attribute: str, value: str) -> str | None:
        if attribute == "src":
            return session_file_url(value, session_url)
        if attribute == "href":  # nh3 let through http(s) and scheme-less URLs only
            if value.lower().startswith(("http://", "https://")):
                return value
            return session_file_url(value, session_url)
        return value

    return nh3.clean(
        html,
        tags=ANSWER_TAGS,
        attributes=ANSWER_ATTRIBUTES,
        allowed_classes={"th": ALIGNED, "td": ALIGNED},
        url_schemes={"http", "https"},
        attribute_filter=confine,
        set_tag_attribute_values={"a": {"target": "_blank"}},  # rel is noopener noreferrer
    )


def session_file_url(link: str, session_url: str) -> str | None:
    """The download URL of the session file a link names, or None when it names none."""
    split = urlsplit(link)
    if split.scheme or split.netloc:
        return None
    path = unquote(split.path)
    own = f"{session_url}/files/"
    if path.startswith(own):
        rel = path.removeprefix(own)
    elif path.startswith(f"{DATA}/"):
        rel = f"{INPUTS_DIR}/{path.removeprefix(DATA + '/')}"
    elif path.startswith("/") and not path.startswith(f"{WORKSPACE}/"):
        return None
    else:  # the kernel's working directory is the workspace
        root, name = collected_place(path.removeprefix(f"{WORKSPACE}/").removeprefix("./"))
        rel = f"{root}/{name}"
    if parts_of(rel) is None:
        return None
    return own + quote(rel)


def _align_by_class(token: Token) -> None:
    style = token.attrs.pop("style", None) if token.type in ("th_open", "td_open") else None
    if isinstance(style, str) and style.startswith("text-align:"):
        token.attrSet("class", "align-" + style.removeprefix("text-align:"))


def _local_image(token: Token, session_url: str) -> list[Token]:
    """An image of the session's files as it is; one from elsewhere as a link to it (nh3
    keeps its href only if it is http(s)): the page loads nothing from other sites."""
    src = str(token.attrGet("src"))
    if token.type != "image" or session_file_url(src, session_url):
        return [token]
    return [
        Token("link_open", "a", 1, attrs={"href": src}),
        Token("text", "", 0, content=token.content or src),
        Token("link_close", "a", -1),
    ]


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


def final(result: RunResult, served: ServedSession) -> dict:
    return {
        "answer": result.answer,
        "answer_html": None if result.answer is None else answer_html(result.answer, served.url),
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
        from the RunResult, once the files are in place, and the trace's own records not."""
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
            case ev.NetConnection():  # --allow-net: where a cell went, or was refused
                self._put("net", event.to_json())
            case ev.Notice(text=text, kernel_reset=True):
                self._put("warning", {"text": text, "kernel_reset": True})
            case ev.Notice(text=text) | ev.ProtocolChanged(text=text) | ev.VisionOff(text=text):
                self._put("warning", {"text": text})

    def _observation(self, event: ev.Observation) -> dict:
        out = {"tool": event.tool, "ok": event.ok, "text": event.text}
        ex = event.execution
        if ex is not None:
            saved = self.served.save_figures(ex)
            out["figures"] = [url for url, _ in saved]
            out["charts"] = [chart for _, chart in saved]  # each figure's data, or null
            out.update(shown(ex))
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
