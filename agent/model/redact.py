"""Credentials out of what is shown: an endpoint URL may carry them (`https://user:pass@host/v1`,
`?api_key=...`), and every message that names the endpoint reaches users' streams and traces."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

HIDDEN = "***"
# query parameters that carry a credential (api_key, key, token, access_token, sig, ...)
_SECRET_NAME = re.compile(r"key|token|secret|pass|auth|sig|cred|session", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL with its userinfo and the values of credential-like query parameters hidden;
    everything else (scheme, host, port, path, other parameters) kept, so it still says where."""
    try:
        parts = urlsplit(url)
        port = parts.port  # a malformed port raises here
    except ValueError:
        return HIDDEN  # not a URL: nothing in it can be shown safely
    netloc = parts.hostname or ""
    if ":" in netloc:  # an IPv6 address
        netloc = f"[{netloc}]"
    if port is not None:
        netloc += f":{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{HIDDEN}@{netloc}"
    query = "&".join(
        f"{name}={HIDDEN if _SECRET_NAME.search(name) else value}" if sep else name
        for name, sep, value in _pairs(parts.query)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def secrets_of(url: str) -> list[str]:
    """The credential strings in a URL (userinfo, credential-like query values), longest first,
    to scrub from text that quotes them some other way (an error from the HTTP client)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = [parts.username or "", parts.password or "", parts.netloc.rpartition("@")[0]]
    found += [value for name, _, value in _pairs(parts.query) if _SECRET_NAME.search(name)]
    found += [unquote(s) for s in found]  # as an error message may quote them, decoded
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """Text with the URL shown redacted and any of its credentials hidden."""
    text = text.replace(url, redact_url(url))
    for secret in secrets_of(url):
        text = text.replace(secret, HIDDEN)
    return text


def _pairs(query: str) -> list[tuple[str, str, str]]:
    """A query's name=value pairs as written (nothing decoded, so nothing changes on the way)."""
    return [pair.partition("=") for pair in query.split("&") if pair]
