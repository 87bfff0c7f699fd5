"""A cap on request bodies, checked before the app parses them: a declared Content-Length over
the cap is refused at once, and a body sent without one is counted as it arrives. Uploads
have their own (larger) cap; every other route takes a small JSON body."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.agent.hosting.guard import send_error

# Read (and drop) this much of a refused body before answering: a client still sending when
# the connection closes sees a reset instead of the 413. Past it, a reset it is.
DRAIN_BYTES = 32 << 20


def too_large(cap: int, upload: bool) -> str:
    mb = cap / (1 << 20)
    if upload:
        return f"the upload is over {mb:g} MB (--max-upload-mb); send smaller or fewer files"
    return f"the request body is over {mb:g} MB; send less"


class BodyLimit:
    def __init__(self, app: ASGIApp, *, body_bytes: int, upload_bytes: int):
        self.app, self.body_bytes, self.upload_bytes = app, body_bytes, upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope["method"] == "POST" and scope["path"].endswith("/files")
        # multipart headers and boundaries ride on top of the files themselves
        said = self.upload_bytes if upload else self.body_bytes
        cap = said + (64 << 10) if upload else said
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            await _drain(receive)
            # the rest of the body is not read: the connection is not kept
            await send_error(send, 413, too_large(said, upload), {"Connection": "close"})
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:  # raised where the app reads: answered as a JSON 413
                    if message.get("more_body"):
                        await _drain(receive)
                    raise HTTPException(413, too_large(said, upload))
            return message

        await self.app(scope, counted, send)


async def _drain(receive: Receive) -> None:
    dropped = 0
    while dropped < DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return
        dropped += len(message.get("body", b""))
