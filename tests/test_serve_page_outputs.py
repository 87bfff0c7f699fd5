"""The page as an analyst keeps it open (issue 28), in Chromium as test_serve_page.py drives
it: each output once, the files the code made with their downloads, the uploaded data's
profile, and sessions renamed and deleted from the list."""

import io
import os
import zipfile
from pathlib import Path

import pytest

from tests.serve_helpers import ALICE, client, new_session, python
from tests.test_serve_page import WAIT_MS, answer_text, ask, base, browser, model, page  # noqa: F401

SALES = Path(__file__).parent / "data" / "agent" / "sales.csv"
SCREENSHOT = Path(__file__).parent.parent / "docs" / "serve.png"
MARKUP = "<img src=x onerror=window.pwned=1>.txt"  # a file name: no "/"
CELL = (
    "import os, shutil, pandas as pd, matplotlib.pyplot as plt\n"
    "os.makedirs('/workspace/output', exist_ok=True)\n"
    "shutil.copy('/data/sales.csv', '/workspace/output/result.csv')\n"
    f"open('/workspace/output/{MARKUP}', 'w').write('marked')\n"
    "df = pd.read_csv('/data/sales.csv')\n"
    "units = df.groupby('region').units.sum()\n"
    "units.plot.bar(title='units by region'); plt.show()\n"
    "print('printed-' + 'once', units.idxmax())\n"
    "units.to_frame().assign(code=[987000 + 654, 1, 2])"
)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_outputs_once_files_to_download_and_the_inputs_profile(page, model, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    model.add(
        {"content": "Units per region, and the data saved.", "tool_calls": python(CELL)["tool_calls"]},
        "Final Answer: East sold the most units; the data is in output/result.csv.",
    )  # fmt: skip
    page.get_by_test_id("upload").set_input_files(str(SALES))
    profile = page.get_by_test_id("input-profile")
    expect(profile).to_have_count(1)
    expect(page.locator("#status")).to_have_class("success")
    # the shape at a glance, the profile itself folded below it
    expect(profile.locator("summary")).to_have_text("profile: 12 rows × 5 columns, 0 missing")
    expect(profile.locator("pre")).to_be_hidden()
    profile.locator("summary").click()
    expect(profile.locator("pre")).to_be_visible()
    expect(profile).to_contain_text("12 rows x 5 columns")  # the file_metadata tool's words
    expect(profile).to_contain_text("units: int, 0 nulls")
    ask(page, "Which region sold the most units? Save the data.")
    answer_text(page)
    steps = page.locator("#steps")
    expect(steps.locator("pre.output")).to_contain_text("printed-once East")
    text = steps.inner_text()
    assert text.count("printed-once") == 1, text  # not again in the observation
    assert text.count("987654") == 1, text  # the DataFrame as its table alone
    expect(page.get_by_test_id("table")).to_contain_text("987654")
    expect(page.locator(".step.action pre.output")).to_have_count(0)  # moved, not copied

    links = page.get_by_test_id("output-file")
    expect(links).to_have_count(3)  # the csv, the markup-named file, the chart
    paths = links.all_inner_texts()
    assert f"output/{MARKUP}" in paths and "output/result.csv" in paths, paths
    assert any(p.startswith("figures/") for p in paths), paths
    expect(page.locator("#outputs")).to_contain_text("413 B")  # sales.csv's size
    with page.expect_download() as downloading:
        links.filter(has_text="result.csv").click()
    assert Path(downloading.value.path()).read_bytes() == SALES.read_bytes()
    with page.expect_download() as downloading:
        links.filter(has_text=MARKUP).click()
    assert Path(downloading.value.path()).read_bytes() == b"marked"
    with page.expect_download() as downloading:
        page.get_by_test_id("download-all").click()
    with zipfile.ZipFile(io.BytesIO(Path(downloading.value.path()).read_bytes())) as archive:
        assert sorted(archive.namelist()) == sorted(paths)
        assert archive.read("output/result.csv") == SALES.read_bytes()
    # the markup in the file name is text: no element made of it, no script ran
    assert page.evaluate("document.querySelectorAll('#outputs img, #inputs img').length") == 0
    page.wait_for_timeout(300)
    assert page.evaluate("window.pwned") is None

    SCREENSHOT.parent.mkdir(exist_ok=True)
    # the README's picture: `SANDCELL_SCREENSHOT=1 make test` renews docs/serve.png
    shot = SCREENSHOT if os.environ.get("SANDCELL_SCREENSHOT") else tmp_path / "serve.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:4] == b"\x89PNG"

    # the list and the profile are there again for the session reopened
    page.reload()
    page.get_by_test_id("open-session").click()
    expect(page.get_by_test_id("output-file")).to_have_count(3)
    expect(page.get_by_test_id("input-profile")).to_contain_text("12 rows x 5 columns")
    expect(page.get_by_test_id("input-profile").locator("summary")).to_have_text(
        "profile: 12 rows × 5 columns, 0 missing"
    )
    assert page.dialogs == [] and page.errors == []


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_sessions_are_renamed_and_deleted_from_the_list(browser, base):  # noqa: F811
    from playwright.sync_api import expect

    with client(base, ALICE) as api:
        kept, gone = new_session(api), new_session(api)
    context = browser.new_context()
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    asked, accept = [], [False]  # the confirmation's text; whether the person says yes

    def confirm(dialog) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept[0] else dialog.dismiss()

    tab.on("dialog", confirm)
    errors = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    try:
        tab.goto(f"{base}/?token={ALICE}")
        listed = tab.get_by_test_id("open-session")
        expect(listed).to_have_count(2)
        expect(listed.first).to_contain_text("untitled session")

        keep = tab.locator("#sessions li", has=tab.locator(f"[title='{kept}']"))
        keep.get_by_test_id("rename-session").click()
        tab.get_by_test_id("rename-input").fill("Q3 <b>sales</b>")
        tab.get_by_test_id("rename-input").press("Enter")
        expect(tab.locator(f"[title='{kept}'] .title")).to_have_text("Q3 <b>sales</b>")  # text

        # a dismissed confirmation deletes nothing; an accepted one deletes
        drop = tab.locator("#sessions li", has=tab.locator(f"[title='{gone}']"))
        drop.get_by_test_id("delete-session").click()
        expect(listed).to_have_count(2)
        assert len(asked) == 1 and "cannot be undone" in asked[0]
        accept[0] = True
        drop.get_by_test_id("delete-session").click()
        expect(tab.locator("#status")).to_have_text("session deleted")
        tab.reload()
        expect(listed).to_have_count(1)
        expect(listed).to_contain_text("Q3 <b>sales</b>")
        assert tab.evaluate("document.querySelectorAll('#sessions b').length") == 0
        with client(base, ALICE) as api:
            assert [s["id"] for s in api.get("/api/sessions").json()] == [kept]
        assert errors == []
    finally:
        context.close()
