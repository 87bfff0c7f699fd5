"""Who is asking: a bearer token from --users (or the one printed at start), and the
session it owns. Another user's session answers as a missing one does."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from agent.serve.served import ServedSession

bearer = HTTPBearer(auto_error=False, description="a token from --users, or the one printed")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def current_user(request: Request, credentials: Credentials) -> str:
    given = credentials.credentials.encode() if credentials else None
    name = None
    for token, user in request.app.state.tokens.items():  # every one: no timing hint
        if given is not None and secrets.compare_digest(token.encode(), given):
            name = user
    if name is not None:
        return name
    message = "send Authorization: Bearer <token> (the token `sandcell serve` printed)"
    if given is not None:
        message = "that token is not one of this server's; " + message
    raise HTTPException(401, message, headers={"WWW-Authenticate": "Bearer"})


def owned(id: str, request: Request, user: Annotated[str, Depends(current_user)]) -> ServedSession:
    return request.app.state.sessions.get(user, id)
