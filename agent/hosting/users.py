"""The users of a server (`sandcell serve`, `sandcell mcp --http`) and their tokens: the
--users file read (name:token a line), one user with a fresh token without it, and which
user a token names."""

from __future__ import annotations

import re
import secrets
from pathlib import Path

# A user's name is a folder under --data: plain characters only, never "." or "..".
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MIN_TOKEN_CHARS = 16  # a short token can be guessed by anyone who can reach the port
DEFAULT_USER = "local"  # the one user when no --users file is given


class UsersError(ValueError):
    """The users file cannot be used; the message names the line."""


def token_owner(users: dict[str, str], token: str | None) -> str | None:
    """The user whose token this is, or None; every token is compared (no timing hint)."""
    given = token.encode() if token else None
    name = None
    for user, known in users.items():
        if given is not None and secrets.compare_digest(known.encode(), given):
            name = user
    return name


def one_user() -> dict[str, str]:
    """No --users file: one user with a fresh token, printed in the URL as Jupyter does."""
    return {DEFAULT_USER: secrets.token_urlsafe(24)}


def load_users(path: Path) -> dict[str, str]:
    """`name:token` a line; blank lines and lines starting with # are skipped."""
    users: dict[str, str] = {}
    tokens: set[str] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = (part.strip() for part in line.partition(":"))
        where = f"{path}:{n}"
        if not sep or not token:
            raise UsersError(f"{where}: write one user a line as name:token")
        if not USER_NAME.fullmatch(name):
            raise UsersError(
                f"{where}: user name {name!r} must be letters, digits, '_', '.' or '-' "
                "(it names a folder under --data)"
            )
        if len(token) < MIN_TOKEN_CHARS:
            raise UsersError(
                f"{where}: the token of {name} is shorter than {MIN_TOKEN_CHARS} characters; "
                "make one with `python -c 'import secrets; print(secrets.token_urlsafe(24))'`"
            )
        if name in users:
            raise UsersError(f"{where}: user {name} is named twice")
        if token in tokens:
            raise UsersError(f"{where}: the token of {name} is another user's token too")
        users[name] = token
        tokens.add(token)
    if not users:
        raise UsersError(f"{path} names no users; write one a line as name:token")
    return users
