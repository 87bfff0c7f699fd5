"""An answer's Markdown as the page gets it (agent/serve/stream.py answer_html): markdown-it-py
renders, nh3 keeps only Markdown's tags, links to http(s) or the session's own files."""

import re
import time
from html.parser import HTMLParser

import pytest

from sandcell.agent.serve.stream import MAX_ANSWER_MARKDOWN, answer_html, session_file_url

URL = "/api/sessions/s1"


def elements(html: str) -> list[tuple[str, dict[str, str | None]]]:
    """Each element as a browser would parse it: (tag, attributes)."""
    found = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, dict(attrs)))

    Parser().feed(html)
    return found


def tags_of(html: str) -> set[str]:
    return {tag for tag, _ in elements(html)}


@pytest.mark.timeout(30)
def test_tables_lists_code_and_emphasis_render():
    text = (
        "# Units\n\n| region | units |\n|:--|--:|\n| East | 37 |\n| North | 36 |\n\n"
        "- **East** sold the most\n- *North* next\n\n1. one\n2. two\n\n"
        "```python\nprint('<b>')\n```\n\n> quoted `x < 1` ~~gone~~"
    )
    html = answer_html(text, URL)
    assert {"h1", "table", "thead", "tbody", "th", "td", "ul", "ol", "li", "strong"} <= tags_of(
        html
    )
    assert {"em", "pre", "code", "blockquote", "s"} <= tags_of(html)
    assert '<td class="align-right">37</td>' in html  # alignment as a class: CSP forbids style=""
    assert "style=" not in html and "language-" not in html
    assert "print(&#39;&lt;b&gt;&#39;)" in html or "print('&lt;b&gt;')" in html


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "payload",
    [
        "<img src=x onerror=alert(1)>",
        "<script>alert(1)</script>",
        '<a href="javascript:alert(1)">x</a>',
        "<svg onload=alert(1)>",
        "[x](javascript:alert(1))",
        "[x](JaVaScRiPt:alert(1))",
        "[x](<javascript&colon;alert(1)>)",
        "<javascript:alert(1)>",
        "[x](data:text/html,<script>alert(1)</script>)",
        "![x](javascript:alert(1))",
        "[x](vbscript:msgbox(1))",
        '[x](https://ok.example "t\\" onmouseover=\\"alert(1)")',
    ],
)
def test_raw_html_scripts_event_attributes_and_script_links_never_survive(payload):
    html = answer_html(f"before {payload} after", URL)
    assert tags_of(html) <= {"p", "a"}, html
    for _, attributes in elements(html):
        assert not any(name.startswith("on") for name in attributes), html
        for name in ("href", "src"):
            if name in attributes:
                assert re.match(r"https?://|/api/sessions/s1/files/", attributes[name] or ""), html


@pytest.mark.timeout(30)
def test_links_go_to_http_or_the_sessions_files_and_images_only_to_its_files():
    text = (
        "[a](output/by region.csv) [b](</workspace/figures/f 1.png>) [c](/data/sales.csv) "
        "[d](notes.txt) [e](https://example.com/x?y=1) [f](/etc/passwd) [g](../../secret) "
        "[h](//evil.example/x) [i](ftp://evil.example/x) [j](/api/sessions/other/files/x) "
        "[k](/workspace/.hidden) ![own](figures/f.png) ![far](http://evil.example/t.png)"
    )
    html = answer_html(text.replace("by region", "by%20region"), URL)
    hrefs = dict(re.findall(r'<a href="([^"]*)"[^>]*>([^<]*)</a>', html))
    assert {text: href for href, text in hrefs.items()} == {
        "a": f"{URL}/files/output/by%20region.csv",
        "b": f"{URL}/files/figures/f%201.png",
        "c": f"{URL}/files/inputs/sales.csv",
        "d": f"{URL}/files/workspace/notes.txt",
        "e": "https://example.com/x?y=1",
        "far": "http://evil.example/t.png",  # an image from elsewhere: a link, never loaded
    }
    assert re.findall(r'<img src="([^"]*)"', html) == [f"{URL}/files/figures/f.png"]
    for refused in "fghijk":  # shown as text, linked nowhere
        assert re.search(rf"<a [^>]*>{refused}</a>", html) and f">{refused}<" in html


@pytest.mark.timeout(30)
def test_session_file_url_refuses_what_the_download_route_would():
    assert session_file_url("output/x.csv", URL) == f"{URL}/files/output/x.csv"
    assert session_file_url(f"{URL}/files/output/x.csv", URL) == f"{URL}/files/output/x.csv"
    for bad in ["/etc/passwd", "output/../../x", "javascript:alert(1)", "//h/x", "output/.x", ""]:
        assert session_file_url(bad, URL) is None, bad


@pytest.mark.timeout(60)
def test_a_long_hostile_answer_renders_in_bounded_time_and_says_it_was_cut():
    for text in ["[" * 200_000, "*_" * 100_000, "|a|b|\n|-|-|\n" + "|1|2|\n" * 40_000]:
        started = time.monotonic()
        html = answer_html(text, URL)
        assert time.monotonic() - started < 10  # about 0.7 s here; a 2-core CI under load
        assert len(text) > MAX_ANSWER_MARKDOWN and "the answer goes on" in html
