"""A session as the API shows it (`GET /api/sessions`, `GET /api/sessions/{id}`): one shape
for a live session and for one stored from before a restart, documented in /openapi.json."""

from typing import Literal

from pydantic import BaseModel, Field


class SessionInfo(BaseModel):
    id: str
    title: str = Field(
        description="the title given by PATCH /api/sessions/{id}, else the first question; "
        "empty before one is asked"
    )
    created: str = Field(description="when the session was made (ISO 8601)")
    running: bool = Field(description="a question or code is running now")
    sandbox: Literal["live", "paused", "released"] = Field(
        description="paused: no container now, its kernel kept on disk (gVisor), restored as "
        "it was by the next message or code; released: no container now (idle, or from "
        "before a restart), the next message or code starts one"
    )
    inputs: list[str] = Field(description="the files under /data")
    questions: int = Field(description="questions asked so far")
    resumed: bool = Field(description="listed again after a restart of the server")
    node: str | None = Field(
        default=None,
        description="with --ray: the hex id of the Ray node holding the session's sandbox; "
        "null while paused or released, and without --ray",
    )
