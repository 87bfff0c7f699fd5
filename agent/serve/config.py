"""What one server is started with: the model, the limits, its users and where sessions live."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from agent.seams import Model
from agent.stops import Rules
from sandbox.limits import Limits

# A user's name is a folder under --data: plain characters only, never "." or "..".
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MIN_TOKEN_CHARS = 16  # a short token can be guessed by anyone who can reach the port
DEFAULT_USER = "local"  # the one user when no --users file is given


class UsersError(ValueError):
    """The users file cannot be used; the message names the line."""


@dataclass
class ServeConfig:
    model: Model
    users: dict[str, str]  # name -> token
    data: Path = Path("sandcell-data")
    limits: Limits = field(default_factory=Limits)
    rules: Rules = field(default_factory=Rules)
    protocol: str = "auto"
    vision: str = "auto"  # --vision: the model sees the figures its code made
    image: str | None = None
    max_sessions: int = 8  # sessions holding a sandbox at once
    # of those, one user's, so that another user is still served; None: half of them (at
    # least 1), or all of them when the server has one user
    max_sessions_per_user: int | None = None
    max_user_mb: float = 2048.0  # one user's disk: uploads and session folders, DATA/<user>
    pool: int = 2  # warm sandboxes waiting
    idle_minutes: float = 30.0  # then a session's sandbox is released
    max_upload_mb: float = 100.0  # one upload request, all its files together
    max_body_bytes: int = 1 << 20  # any other request body (a message, code to run)
    host: str = "127.0.0.1"  # the address listened on: which Host names are answered
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host: more names ('*': any)

    @property
    def idle_s(self) -> float:
        return self.idle_minutes * 60

    @property
    def user_sessions(self) -> int:
        """The cap on one user's sessions holding a sandbox."""
        if self.max_sessions_per_user is not None:
            return min(self.max_sessions_per_user, self.max_sessions)
        return self.max_sessions if len(self.users) == 1 else max(1, self.max_sessions // 2)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * (1 << 20))

    @property
    def max_user_bytes(self) -> int:
        return int(self.max_user_mb * (1 << 20))


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
