"""Answers as Markdown on the page, in Chromium: tables, a copy button on code, links to the
session's files, the same rendering when a session is reopened, and payloads that do nothing."""
# ruff: noqa: F811 (the browser fixtures of test_serve_page.py are imported, then used by name)

import os
from pathlib import Path

import pytest

from tests.serve_helpers import python
from tests.test_serve_page import (  # noqa: F401
    SALES,
    answer_text,
    ask,
    base,
    browser,
    model,
    page,
)

SCREENSHOT = Path(__file__).parent.parent / "docs" / "markdown-answer.png"
SUMS = (
    "import pandas as pd\n"
    "df = pd.read_csv('/data/sales.csv')\n"
    "by = df.groupby('region').agg(units=('units', 'sum'), orders=('units', 'size'))\n"
    "by.sort_values('units', ascending=False).to_csv('output/by_region.csv')\n"
    "by"
)
CODE = "df.groupby('region').units.sum().sort_values()"
ANSWER = f"""Final Answer: **East** sold the most units, just ahead of North.

| region | units | orders |
|:-------|------:|-------:|
| East   |    37 |      3 |
| North  |    36 |      5 |
| South  |    29 |      4 |

- North needed the most orders: 5, at 7.2 units each.
- The table is in [by_region.csv](output/by_region.csv).

To check it yourself:

```python
{CODE}
```
"""
PAYLOADS = (
    "Final Answer: a <img src=x onerror=\"alert('img')\"> and [click](javascript:alert('js')) "
    "and <a href=\"javascript:alert('a')\">raw</a> and [far](//evil.example/x) "
    "and ![pixel](http://127.0.0.1:9/pixel.png) and <svg onload=\"alert('svg')\">"
)


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_a_markdown_answer_shows_a_table_a_file_link_and_code_with_a_copy_button(
    page, model, tmp_path
):
    from playwright.sync_api import expect

    model.add(python(SUMS), ANSWER)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.get_by_test_id("upload").set_input_files(str(SALES))
    expect(page.locator("#inputs")).to_contain_text("/data/sales.csv")
    ask(page, "Which region sold the most units? Show a table.")
    answer = page.get_by_test_id("answer")
    answer.wait_for(state="visible")
    table = answer.locator("table")
    expect(table).to_be_visible()
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(table.locator("th").nth(1)).to_have_text("units")
    expect(table.locator("tbody tr").first.locator("td")).to_have_text(["East", "37", "3"])
    expect(answer.locator("strong")).to_have_text("East")
    expect(answer.locator("li")).to_have_count(2)
    sid = page.evaluate("state.session")
    link = answer.get_by_role("link", name="by_region.csv", exact=True)
    expect(link).to_have_attribute("href", f"/api/sessions/{sid}/files/output/by_region.csv")
    fetched = "async h => { const r = await fetch(h); return [r.status, await r.text()]; }"
    status, body = page.evaluate(fetched, link.get_attribute("href"))
    assert status == 200 and body.startswith("region,units,orders\nEast,37,3")
    copy = answer.get_by_test_id("copy")
    expect(copy).to_have_count(1)
    SCREENSHOT.parent.mkdir(exist_ok=True)
    # the README's picture: `SANDCELL_SCREENSHOT=1 make test` renews docs/markdown-answer.png
    shot = SCREENSHOT if os.environ.get("SANDCELL_SCREENSHOT") else tmp_path / "answer.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:4] == b"\x89PNG"
    copy.click()
    expect(copy).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == CODE + "\n"
    # reopened, the session's history shows the answer rendered the same way
    page.locator("#new-session").click()
    expect(page.get_by_test_id("answer")).to_have_count(0)
    page.get_by_test_id("sessions").get_by_test_id("open-session").click()
    again = page.get_by_test_id("answer")
    expect(again.locator("table tbody tr")).to_have_count(3)
    expect(again.get_by_role("link", name="by_region.csv", exact=True)).to_have_attribute(
        "href", f"/api/sessions/{sid}/files/output/by_region.csv"
    )
    expect(again.get_by_test_id("copy")).to_have_count(1)
    assert page.dialogs == [] and page.errors == []


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_img_onerror_and_javascript_links_in_an_answer_do_nothing(page, model):
    from playwright.sync_api import expect

    model.add(PAYLOADS)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    ask(page, "say something dangerous")
    text = answer_text(page)
    assert "<img src=x onerror=" in text and "<svg onload=" in text  # shown as text
    answer = page.get_by_test_id("answer")
    assert page.evaluate("document.querySelectorAll('[onerror], [onload], svg').length") == 0
    assert answer.locator("img").count() == 0  # an image from elsewhere is a link, not loaded
    hrefs = answer.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert hrefs == [None, "http://127.0.0.1:9/pixel.png"], hrefs  # far: no href; no javascript:
    expect(answer).to_contain_text("[click](javascript:alert('js'))")  # Markdown refused it
    answer.get_by_text("far", exact=True).click()  # a link Markdown made, its href dropped
    expect(answer).to_contain_text("raw")
    page.wait_for_timeout(500)  # an onerror or a click's script would have run by now
    assert not any("pixel.png" in url or "evil.example" in url for url in requests)
    assert page.dialogs == [] and page.errors == []
