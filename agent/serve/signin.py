"""Signing in by `/?token=`: only a navigation the person made themselves sets the cookie.

A link on another site could otherwise sign a person into the sender's account (their
uploads would then land where the sender reads them). Browsers say where a navigation came
from in `Sec-Fetch-Site`: `none` (typed, bookmarked, pasted, opened from a terminal) and
`same-origin` set the cookie at once; `cross-site` and `same-site` get a page that asks for a
click first, whose form sends the same URL from this origin. A request without the header
is not from a browser that could be led by a link (every current browser sends it on
navigations), so it signs in as before."""

from __future__ import annotations

from html import escape

from fastapi import Request
from fastapi.responses import HTMLResponse

OWN_NAVIGATION = frozenset({"none", "same-origin"})

# The click page: no script at all, a plain form; it may send its form only here.
CLICK_CSP = (
    "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
CLICK_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>sandcell: sign in?</title>
<link rel="stylesheet" href="/static/page.css">
</head>
<body>
<main class="signin">
  <h1>Sign in to sandcell?</h1>
  <p>A link from another site brought you here with a sign-in token. Sign in only if it is
  your own: with someone else's token, the files you upload and the questions you ask go to
  their account.</p>
  <form method="get" action="/">
    <input type="hidden" name="token" value="{token}">
    <button type="submit" data-testid="sign-in">Sign in</button>
  </form>
</main>
</body>
</html>
"""


def own_navigation(request: Request) -> bool:
    site = request.headers.get("sec-fetch-site")
    return site is None or site.lower() in OWN_NAVIGATION


def click_page(token: str, headers: dict[str, str]) -> HTMLResponse:
    page = CLICK_PAGE.replace("{token}", escape(token, quote=True))
    return HTMLResponse(page, headers={**headers, "Content-Security-Policy": CLICK_CSP})
