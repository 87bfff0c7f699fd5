"""The users of a server (`sandcell serve`, `sandcell mcp --http`) and their tokens: the
--users file read (`name:token` a line, then options: `allow-net=HOST[,HOST...]` narrows the
server's --allow-net for that user), one user with a fresh token without it, and which user a
token names."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.sandbox.allowlist import Allowlist

# A user's name is a folder under --data: plain characters only, never "." or "..".
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MIN_TOKEN_CHARS = 16  # a short token can be guessed by anyone who can reach the port
DEFAULT_USER = "local"  # the one user when no --users file is given


class UsersError(ValueError):
    """The users file cannot be used; the message names the line."""


@dataclass(frozen=True)
class Users:
    tokens: dict[str, str]  # name -> token
    # name -> the hosts that user's sessions may reach, where their line narrows --allow-net
    allow_net: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def narrowed(self, server: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """Each narrowing user's entries, checked against the server's --allow-net: UsersError
        for an entry it does not cover (a user's line takes hosts away, never adds one)."""
        allowed = Allowlist.parse(server)
        kept = {}
        for name, entries in self.allow_net.items():
            mine = Allowlist.parse(entries)
            if not allowed:
                raise UsersError(
                    f"user {name}'s allow-net= narrows the server's --allow-net, which is not "
                    "given; add --allow-net, or take allow-net= from the users file"
                )
            beyond = set(mine.entries) - set(allowed.narrowed(mine).entries)
            if beyond:
                raise UsersError(
                    f"user {name}'s allow-net= names {', '.join(sorted(map(str, beyond)))}, "
                    f"beyond the server's --allow-net ({allowed}); a user's line may only narrow it"
                )
            kept[name] = tuple(str(entry) for entry in mine.entries)
        return kept


def token_owner(users: dict[str, str], token: str | None) -> str | None:
    """The user whose token this is, or None; every token is compared (no timing hint)."""
    given = token.encode() if token else None
    name = None
    for user, known in users.items():
        if given is not None and secrets.compare_digest(known.encode(), given):
            name = user
    return name


def one_user() -> Users:
    """No --users file: one user with a fresh token, printed in the URL as Jupyter does."""
    return Users({DEFAULT_USER: secrets.token_urlsafe(24)})


def load_users(path: Path) -> Users:
    """`name:token [allow-net=HOST[,HOST...]]` a line; blank lines and lines starting with #
    are skipped."""
    tokens: dict[str, str] = {}
    allow_net: dict[str, tuple[str, ...]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, rest = (part.strip() for part in line.partition(":"))
        token, *options = rest.split() or [""]
        where = f"{path}:{n}"
        if not sep or not token or "=" in token:  # an option where the token should be
            raise UsersError(f"{where}: write one user a line as name:token [allow-net=HOST,...]")
        for option in options:
            key, _, value = option.partition("=")
            if key != "allow-net" or not value:  # the words are not echoed: a token's, maybe
                raise UsersError(
                    f"{where}: after the token of {name} comes what is not an option of a user; "
                    "the one there is allow-net=HOST[,HOST...] (a token holds no whitespace)"
                )
            try:
                entries = Allowlist.parse([value]).entries
            except ValueError as error:
                raise UsersError(f"{where}: allow-net= of {name}: {error}") from None
            allow_net[name] = (*allow_net.get(name, ()), *map(str, entries))
        check_user(where, name, token, tokens)
        tokens[name] = token
    if not tokens:
        raise UsersError(f"{path} names no users; write one a line as name:token")
    return Users(tokens, allow_net)


def check_user(where: str, name: str, token: str, tokens: dict[str, str]) -> None:
    """UsersError naming the line when the name or the token cannot be used."""
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
    if name in tokens:
        raise UsersError(f"{where}: user {name} is named twice")
    if token in tokens.values():
        raise UsersError(f"{where}: the token of {name} is another user's token too")
