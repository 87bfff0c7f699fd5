"""The API's routes. Each is thin: the session work is in sessions.py, names and paths in
files.py, the event stream in stream.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import anyio
import nbformat
from fastapi import APIRouter, Depends, File, Request, Response, UploadFile
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field, field_validator
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from sandcell.agent.events import Final, Question
from sandcell.agent.records.notebook import trace_to_notebook
from sandcell.agent.records.trace import read_events
from sandcell.agent.serve import files, outputs, titles
from sandcell.agent.serve.auth import COOKIE, current_user, owned, user_of
from sandcell.agent.serve.listing import SessionInfo
from sandcell.agent.serve.served import ServedSession
from sandcell.agent.serve.sessions import Sessions
from sandcell.agent.serve.signin import click_page, own_navigation
from sandcell.agent.serve.stream import MessageStream, answer_html
from sandcell.tools.file_metadata import FileMetadata
from sandcell.tools.profile import Profile, glance
from sandcell.tools.registry import ToolError

router = APIRouter()
User = Annotated[str, Depends(current_user)]
Owned = Annotated[ServedSession, Depends(owned)]
MAX_TEXT = 512 << 10  # characters of one message or one cell; the body cap is the backstop
# Downloads are attachments the browser never renders as a page of this origin: an uploaded
# or model-made HTML file cannot run script here.
DOWNLOAD_HEADERS = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
# the page: index.html, page.js, page.css. resolve(): in a strict editable install this module is
# a link into the clone, and StaticFiles serves no links; the clone's folder holds real files
STATIC = Path(__file__).resolve().parent / "static"
# The page runs only its own script file: no inline script, no eval, no plugin, no framing.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Message(BaseModel):
    content: str = Field(max_length=MAX_TEXT, description="the question")

    @field_validator("content")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the question is empty; send its text")
        return value


class Code(BaseModel):
    code: str = Field(max_length=MAX_TEXT)
    timeout: float | None = Field(
        None,
        gt=0,
        description=(
            "seconds for this cell, at most the server's cell timeout (`sandcell serve "
            "--timeout`, 60 s unless the operator set another); more is refused with a 422 "
            "that names the server's maximum. Omitted: the server's cell timeout."
        ),
    )


class Created(BaseModel):
    id: str


class Uploaded(BaseModel):
    names: list[str]  # as they are under /data
    inputs: list[str]  # every input of the session now
    profiles: dict[str, str] = Field(
        description="each uploaded file's profile (rows, columns, types, missing counts, first "
        "rows), by name: the file_metadata tool's, as the model reads it"
    )
    summaries: dict[str, str] = Field(
        description="each uploaded file's shape in one line, by name, for a person: "
        '"60 rows × 3 columns, 0 missing" (a table), "text, 54 lines", "binary, 3.0 KiB"'
    )


class Rename(BaseModel):
    title: str = Field(max_length=titles.MAX_TITLE, description="the session's new title")

    @field_validator("title")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not titles.clean(value):
            raise ValueError("the title is empty; send its text")
        return value


def sessions_of(request: Request) -> Sessions:
    return request.app.state.sessions


@router.get("/", include_in_schema=False, response_model=None)
def page(request: Request, token: str | None = None) -> Response:
    """The page. `/?token=` once: the token goes into an HttpOnly, SameSite=Strict cookie and
    the browser is sent back to `/`, so the token is in no URL, history entry or Referer.
    A link from another site gets a page asking for a click first (signin.py)."""
    if token is None:
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=PAGE_HEADERS)
    if user_of(request, token) is None:
        raise HTTPException(401, "that token is not one of this server's; open the URL it printed")
    if not own_navigation(request):
        return click_page(token, PAGE_HEADERS)
    response = RedirectResponse("/", status_code=303, headers=PAGE_HEADERS)
    response.set_cookie(
        COOKIE,
        token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.get("/api/health")
async def health() -> dict:  # on the loop: answers even when every worker thread waits
    return {"status": "ok"}


@router.get("/metrics", include_in_schema=False, response_class=Response)
def metrics(request: Request) -> Response:
    """Prometheus' text format (agent/metrics.py): a token, as the API, unless the server on
    loopback was started with --metrics-public."""
    text = request.app.state.metrics.text()
    return Response(text, media_type=CONTENT_TYPE_LATEST)


@router.post("/api/sessions", status_code=201, response_model=Created)
def create_session(request: Request, user: User) -> dict:
    return {"id": sessions_of(request).create(user).id}


@router.get("/api/sessions")
def list_sessions(request: Request, user: User) -> list[SessionInfo]:
    return sessions_of(request).mine(user)


@router.get("/api/sessions/{id}")
def session_info(served: Owned) -> SessionInfo:
    return served.info()


@router.patch("/api/sessions/{id}")
def rename(body: Rename, served: Owned) -> SessionInfo:
    titles.save(served.folder, body.title)
    return served.info()


@router.delete("/api/sessions/{id}", status_code=204, response_class=Response)
def delete_session(id: str, request: Request, user: User) -> Response:
    sessions_of(request).delete(user, id)
    return Response(status_code=204)


@router.post("/api/sessions/{id}/files", status_code=201, response_model=Uploaded)
def upload(served: Owned, file: Annotated[list[UploadFile], File()], request: Request) -> dict:
    names = [files.clean_name(f.filename) for f in file]
    taken = [n for i, n in enumerate(names) if n in names[:i] or n in served.session.inputs]
    if taken:
        raise HTTPException(
            409, f"an input named {taken[0]} is there already; rename the file and send it again"
        )
    sessions = sessions_of(request)
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else 0  # files and their multipart framing
    refused = f"this upload ({size / (1 << 20):.1f} MB) is refused" if size else ""
    # one upload of the user's at a time (two at once: one after the other): the room left
    # is measured, then counted down as the files are written, so none can pass the budget
    with sessions.uploading(served.user), served.uploading:
        room = sessions.disk_room(served.user, size, refused or "this upload is refused")
        used = sessions.config.max_user_bytes - room
        saved = []
        try:
            for upload_file, name in zip(file, names, strict=True):
                try:
                    path = files.save_upload(upload_file.file, served.inputs_dir, name, room)
                except FileExistsError:
                    raise HTTPException(409, f"an input named {name} is there already")
                except files.OverBudget:
                    raise sessions.over_budget(f"this upload is refused at {name}", used) from None
                saved.append(path)
                room -= path.stat().st_size
            served.session.add_inputs({p.name: p for p in saved})
            served.touch()  # a session being given files is not idle
        except BaseException:  # nothing of a refused upload stays
            for path in saved:
                path.unlink(missing_ok=True)
            raise
    described = {name: _described(served, name) for name in names}
    return {
        "names": names,
        "inputs": served.session.inputs.names,
        "profiles": {name: text for name, (text, _) in described.items()},
        "summaries": {name: summary for name, (_, summary) in described.items()},
    }


def _described(served: ServedSession, name: str) -> tuple[str, str]:
    """The input's profile (the file_metadata tool's, cached with the session's inputs as the
    prompt's is) and its shape in one line; a file it cannot read: the reason, twice."""
    try:
        observation = FileMetadata(served.session.inputs).describe(f"/data/{name}")
    except ToolError as error:  # the reason is what the model reads too
        return str(error), "not readable"
    profile = observation.data
    return observation.text, glance(profile) if isinstance(profile, Profile) else ""


@router.get("/api/sessions/{id}/files")
def list_files(served: Owned) -> dict:
    found = files.listing(served.folder)
    for entry in found:
        entry["url"] = served.url_of(served.folder / entry["path"])
    return {"files": found}


@router.get("/api/sessions/{id}/profiles")
def profiles(served: Owned) -> dict[str, str]:
    """Each input's profile by name, as the upload answered it (for a page reopening it)."""
    return {name: _described(served, name)[0] for name in served.session.inputs.names}


@router.get("/api/sessions/{id}/summaries")
def summaries(served: Owned) -> dict[str, str]:
    """Each input's shape in one line by name ("60 rows × 3 columns, 0 missing"), as the
    upload answered it."""
    return {name: _described(served, name)[1] for name in served.session.inputs.names}


@router.get("/api/sessions/{id}/outputs")
def list_outputs(served: Owned) -> dict:
    """The files the code made (output/ and figures/), newest first: at most
    outputs.MAX_LISTED of them, `total` counting all; `zip` downloads them together."""
    found = outputs.made(served.folder)
    return {
        "files": [
            outputs.as_json(m, served.url_of(served.folder / m.path))
            for m in found[: outputs.MAX_LISTED]
        ],
        "total": len(found),
        "bytes": sum(m.size for m in found),
        "zip": f"{served.url}/outputs.zip" if found else None,
    }


@router.get("/api/sessions/{id}/outputs.zip", response_class=StreamingResponse)
def zip_outputs(served: Owned) -> StreamingResponse:
    """Every file the code made, as one zip written as it is sent (newest first, at most
    outputs.ZIP_MAX_FILES files and ZIP_MAX_BYTES bytes; a note inside names any left out)."""
    found = outputs.made(served.folder)
    if not found:
        raise HTTPException(404, "the code of this session has made no files yet")
    taken, left = outputs.zipped(found)
    headers = {**DOWNLOAD_HEADERS, "Content-Disposition": _attachment(f"sandcell-{served.id}.zip")}
    stream = outputs.zip_stream(served.folder, taken, left)
    return StreamingResponse(stream, media_type="application/zip", headers=headers)


@router.get("/api/sessions/{id}/files/{path:path}", response_class=StreamingResponse)
def download(served: Owned, path: str) -> StreamingResponse:
    opened = files.open_download(served.folder, path)
    if opened is None:
        raise HTTPException(404, f"no file {path} in this session")
    f, size = opened
    name = path.rsplit("/", 1)[-1]
    headers = {**DOWNLOAD_HEADERS, "Content-Length": str(size)}
    headers["Content-Disposition"] = _attachment(name)
    return StreamingResponse(files.chunks(f), media_type=files.media_type(name), headers=headers)


def _attachment(name: str) -> str:
    return f"attachment; filename*=UTF-8''{quote(name)}"


@router.post("/api/sessions/{id}/messages", response_class=EventSourceResponse)
async def post_message(message: Message, served: Owned, request: Request) -> EventSourceResponse:
    # The turn may wait for an idle release, the renewal for a container start: in a thread,
    # so that one slow start holds this request only, not every user's streams. Shielded: a
    # turn taken must reach the stream, whose worker gives it back.
    with anyio.CancelScope(shield=True):
        warning = await anyio.to_thread.run_sync(sessions_of(request).begin_turn, served)
    stream = MessageStream(served, message.content, warning)
    return EventSourceResponse(stream.events(), ping=15)


@router.post("/api/sessions/{id}/interrupt")
def interrupt(served: Owned) -> dict:
    running = served.busy
    if running:
        served.session.interrupt()
    return {"interrupted": running}


@router.post("/api/sessions/{id}/execute")
def execute(body: Code, served: Owned, request: Request, response: Response) -> dict:
    # Refused rather than cut short: a client that asked for more would otherwise read a
    # timeout it did not choose. Busy sessions are never reaped: this deadline is the bound.
    most = request.app.state.config.limits.timeout_s
    if body.timeout is not None and body.timeout > most:
        raise HTTPException(
            422,
            f"timeout: {body.timeout:g} s is over this server's cell timeout of {most:g} s "
            "(sandcell serve --timeout); ask for that or less, or leave it out",
        )
    warning = sessions_of(request).begin_turn(served)
    try:
        ex = served.execute(body.code, body.timeout)
    finally:
        served.done()
    if warning:
        response.headers["X-Sandcell-Warning"] = header_text(warning)
    return ex.to_dict()


def header_text(text: str) -> str:
    """A text as one header value: a warning may carry an engine's multi-line error or a file
    name in any script, and a newline, a control character or non-Latin-1 text in a header
    is refused by the server after the cell ran. Escaped as Python does (\\n, \\x1b, \\u00e9)."""
    return text.encode("unicode_escape").decode("ascii")


@router.get("/api/sessions/{id}/notebook")
def notebook(served: Owned) -> Response:
    # made from the trace on each request: always current, and no file written beside a
    # question that is writing its own
    nb = trace_to_notebook(read_events(served.session.trace_path))
    headers = {
        **DOWNLOAD_HEADERS,
        "Content-Disposition": _attachment(f"sandcell-{served.id}.ipynb"),
    }
    return Response(nbformat.writes(nb), media_type="application/x-ipynb+json", headers=headers)


class Turn(BaseModel):
    question: str
    answer: str | None = Field(description="none while it runs, or when it ended unanswered")
    stop_reason: str | None
    answer_html: str | None = Field(
        default=None, description="the answer's Markdown as sanitised HTML, as the page shows it"
    )


@router.get("/api/sessions/{id}/history")
def history(served: Owned) -> list[Turn]:
    """The questions asked and how each ended: what a page reopening the session shows,
    without sending it the whole trace."""
    turns: list[Turn] = []
    for event in read_events(served.session.trace_path):
        match event:
            case Question(task=task):
                turns.append(Turn(question=str(task or ""), answer=None, stop_reason=None))
            case Final(answer=answer, stop_reason=reason) if turns:
                turns[-1].answer, turns[-1].stop_reason = answer, reason
    for turn in turns:
        if turn.answer is not None:
            turn.answer_html = answer_html(turn.answer, served.url)
    return turns


@router.get("/api/sessions/{id}/trace")
def trace(served: Owned) -> Response:
    data = served.session.trace_path.read_bytes()
    headers = {
        **DOWNLOAD_HEADERS,
        "Content-Disposition": _attachment(f"sandcell-{served.id}.jsonl"),
    }
    return Response(data, media_type="application/jsonl", headers=headers)
