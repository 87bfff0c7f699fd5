"""Who is asking: a bearer token from --users (or the one printed at start), and the
session it owns. Another user's session answers as a missing one does. The page's requests
carry the token in the HttpOnly cookie `/?token=` set (COOKIE); a Bearer header wins over it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from sandcell.agent.hosting.guard import COOKIE, unauthorized
from sandcell.agent.hosting.users import token_owner
from sandcell.agent.serve.served import ServedSession

bearer = HTTPBearer(auto_error=False, description="a token from --users, or the one printed")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def user_of(request: Request, token: str | None) -> str | None:
    return token_owner(request.app.state.users, token)


def current_user(request: Request, credentials: Credentials) -> str:
    token = credentials.credentials if credentials else request.cookies.get(COOKIE)
    name = user_of(request, token)
    if name is not None:
        return name
    raise HTTPException(401, unauthorized(bool(token)), headers={"WWW-Authenticate": "Bearer"})


def owned(id: str, request: Request, user: Annotated[str, Depends(current_user)]) -> ServedSession:
    return request.app.state.sessions.get(user, id)
