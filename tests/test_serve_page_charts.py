"""Charts and tables as data on the page (issue 50), in Chromium as test_serve_page.py drives it:
a bar chart drawn from its data shows a bar's label and value as text when hovered, a
DataFrame's columns sort by a click on their header, and all of it under the page's CSP."""

import time

import pytest

from tests.serve_helpers import python
from tests.test_serve_page import answer_text, ask, base, browser, model, page  # noqa: F401

CELL = (
    "import pandas as pd, matplotlib.pyplot as plt\n"
    "plt.bar(['North', 'South', 'East'], [120.5, 98.1, 80]); plt.title('Sales by region')\n"
    "plt.show()\n"
    "pd.DataFrame({'region': ['North', 'South', 'East'], 'units': [7, 30, 12]})"
)
# the middle of a bar, in the page's pixels: Chart.js's own element for it
BAR_AT = """([index]) => {
  const canvas = document.querySelector('[data-testid=chart] canvas');
  const bar = Chart.getChart(canvas).getDatasetMeta(0).data[index];
  const box = canvas.getBoundingClientRect();
  return [box.left + bar.x, box.top + (bar.y + bar.base) / 2];
}"""


def hover_bar(page, index: int, label: str) -> None:
    """The pointer on bar `index` until the tooltip names it. The bar's place is read again at
    each try: the page scrolls as messages arrive, and a pointer that stays still sees no
    move (once, under load, the tooltip never came)."""
    from playwright.sync_api import expect

    tooltip = page.get_by_test_id("chart-tooltip")
    deadline = time.monotonic() + 60
    while True:
        x, y = page.evaluate(BAR_AT, [index])
        page.mouse.move(x, y)
        try:
            expect(tooltip).to_contain_text(label, timeout=3000)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            page.mouse.move(0, 0)


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_hovering_a_bar_shows_its_value_and_a_table_sorts_by_a_click(page, model):  # noqa: F811
    from playwright.sync_api import expect

    refused = []  # what the Content-Security-Policy blocked, said on the console
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    model.add(python(CELL), "Final Answer: drawn.")
    ask(page, "chart the sales")
    chart = page.get_by_test_id("chart")
    expect(chart.locator("canvas")).to_be_visible()
    tooltip = page.get_by_test_id("chart-tooltip")
    expect(tooltip).to_be_hidden()
    assert "drawn." in answer_text(page)  # the question ended: nothing more will scroll
    hover_bar(page, 1, "South")
    expect(tooltip).to_be_visible()
    expect(tooltip).to_contain_text("98.1")
    hover_bar(page, 0, "North")
    expect(tooltip).to_contain_text("120.5")

    table = page.get_by_test_id("table")
    expect(table).to_contain_text("3 rows × 2 columns")
    regions = table.locator("tbody tr td:nth-child(2)")
    expect(regions).to_have_text(["North", "South", "East"])
    units = table.get_by_role("button", name="units")
    units.click()
    expect(table.locator("tbody tr td:nth-child(3)")).to_have_text(["7", "12", "30"])
    expect(regions).to_have_text(["North", "East", "South"])
    units.click()  # again: the other way
    expect(regions).to_have_text(["South", "East", "North"])
    table.get_by_role("button", name="region").click()
    expect(regions).to_have_text(["East", "North", "South"])
    assert page.errors == [] and page.dialogs == [] and refused == []
