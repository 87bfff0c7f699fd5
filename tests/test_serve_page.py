"""`sandcell serve`'s page in a real browser: Playwright's sync API driving Debian's chromium
(never a downloaded one) against a real uvicorn on loopback, real sandboxes and the scripted
model server. Without chromium or playwright these tests skip outside CI and fail in CI."""

import html
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_runner import free_port, sandcell_process
from tests.missing import cannot_run
from tests.serve_helpers import (  # noqa: F401 (model: a fixture)
    ALICE,
    CHART,
    SALES,
    client,
    config,
    last_tool_message,
    model,
    python,
    serving,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
SCRIPT = "<script>window.pwned=1</script>"
IMG = '<img src=x onerror="window.pwned=1">'
WAIT_MS = 90_000


def browser_problem() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (`make install`)"
    if not Path(CHROMIUM).exists():
        return "Debian's chromium is missing (scripts/ensure-chromium.sh installs it)"
    return None


@pytest.fixture(scope="module")
def browser():
    problem = browser_problem()
    if problem:
        cannot_run(problem, "browser test")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)  # not 5 s: a loaded 2-core machine starts sandboxes slowly
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def base(model, tmp_path):
    with serving(config(model, tmp_path / "data")) as url:
        yield url


@pytest.fixture
def page(browser, base):
    """A signed-in page: `/?token=` once, no script dialog allowed, every page error kept."""
    context = browser.new_context(accept_downloads=True, viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    tab.dialogs, tab.errors = [], []
    tab.on("dialog", lambda d: (tab.dialogs.append(d.message), d.dismiss()))
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    tab.goto(f"{base}/?token={ALICE}")
    assert tab.url == f"{base}/"
    try:
        yield tab
    finally:
        context.close()


def ask(page, question: str) -> None:
    page.get_by_test_id("prompt").fill(question)
    page.get_by_test_id("prompt").press("Enter")


def answer_text(page) -> str:
    answer = page.get_by_test_id("answer")
    answer.wait_for(state="visible")
    return answer.inner_text()


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_upload_ask_steps_stream_chart_and_table_show_notebook_downloads(page, model, tmp_path):
    from playwright.sync_api import expect

    model.add(
        {"content": "Summing units per region.", "tool_calls": [{"name": "python", "arguments": {"code": CHART}}]},
        lambda body: "Final Answer: most units: " + last_tool_message(body).split("\n")[0],
    )  # fmt: skip
    page.get_by_test_id("upload").set_input_files(str(SALES))
    expect(page.locator("#inputs")).to_contain_text("/data/sales.csv")
    ask(page, "Which region sold the most units?")
    expect(page.get_by_test_id("step").first).to_be_visible()
    expect(page.get_by_test_id("stop")).to_be_visible()  # while the question runs
    chart = page.get_by_test_id("chart")
    chart.wait_for(state="visible")  # drawn from its data; the PNG a link beside it
    expect(chart.locator("canvas")).to_be_visible()
    with client(page.url.rstrip("/")) as api:
        png = api.get(chart.get_by_test_id("chart-png").get_attribute("href"))
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    table = page.get_by_test_id("table")
    expect(table.locator("table")).to_be_visible()
    expect(table).to_contain_text("North")
    assert "most units: " in answer_text(page)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    kinds = page.eval_on_selector_all("[data-testid=step]", "nodes => nodes.map(n => n.className)")
    assert any("action" in k for k in kinds) and any("observation" in k for k in kinds)
    code = page.locator("details pre code").inner_text()
    assert code.startswith("import pandas as pd") and "\nunits.plot.bar(); plt.show()\n" in code
    expect(page.get_by_test_id("sessions").locator("li")).to_have_count(1)
    with page.expect_download() as downloading:
        page.get_by_test_id("download-notebook").click()
    download = downloading.value
    assert download.suggested_filename.endswith(".ipynb")
    notebook = json.loads(Path(download.path()).read_text())
    assert notebook["cells"] and any(
        c["cell_type"] == "code" and "plt.show()" in "".join(c["source"]) for c in notebook["cells"]
    )
    assert page.dialogs == [] and page.errors == []


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_stop_interrupts_an_endless_cell(page, model):
    from playwright.sync_api import expect

    model.add(
        python("print('spinning', flush=True)\nwhile True: pass"),
        lambda body: "Final Answer: stopped: " + last_tool_message(body)[-80:],
    )
    ask(page, "spin")
    expect(page.locator(".step.action pre.output")).to_contain_text("spinning")  # it runs now
    page.get_by_test_id("stop").click()
    assert "KeyboardInterrupt" in answer_text(page)
    # the error once, in the error style; the line printed live is the observation's now
    expect(page.locator(".step.observation pre.error")).to_contain_text("KeyboardInterrupt")
    expect(page.locator(".step.observation pre.output")).to_contain_text("spinning")
    expect(page.locator(".step.action pre.output")).to_have_count(0)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect(page.get_by_test_id("send")).to_be_enabled()


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_payloads_in_cells_file_name_and_answer_show_as_text_and_never_run(page, model):
    from playwright.sync_api import expect

    show = (
        "import glob, pandas as pd\n"
        "df = pd.read_csv(glob.glob('/data/*.csv')[0])\n"
        "print(df.to_string())\n"
        "df"
    )
    model.add(
        {"content": f"Looking {SCRIPT}", "tool_calls": [{"name": "python", "arguments": {"code": show}}]},
        f"Final Answer: here {SCRIPT} and {IMG}",
    )  # fmt: skip
    csv = f'name,note\n"{SCRIPT}","{IMG.replace(chr(34), chr(34) * 2)}"\n'.encode()
    name = "<img src=x onerror=window.pwned=1>.csv"  # browsers send a `"` in a name as %22
    page.get_by_test_id("upload").set_input_files(
        files=[{"name": name, "mimeType": "text/csv", "buffer": csv}]
    )
    expect(page.locator("#inputs")).to_contain_text(f"/data/{name}")
    ask(page, f"show {SCRIPT}")
    text = answer_text(page)
    assert SCRIPT in text and IMG in text
    table = page.get_by_test_id("table")
    expect(table).to_contain_text(SCRIPT)
    expect(table).to_contain_text(IMG)
    expect(page.locator(".step.observation pre").first).to_contain_text(SCRIPT)
    expect(page.locator(".step.thought")).to_contain_text(SCRIPT)
    expect(page.get_by_test_id("sessions")).to_contain_text(name)
    # nothing made it into the document as an element: no script or img but the page's own
    assert page.evaluate("document.querySelectorAll('#steps script, #inputs img').length") == 0
    assert page.evaluate("document.querySelectorAll('#steps img:not([data-testid=chart])').length") == 0  # fmt: skip
    page.wait_for_timeout(500)  # an onerror would have fired by now
    assert page.evaluate("window.pwned") is None
    assert page.dialogs == [] and page.errors == []


@pytest.mark.timeout(120)
def test_the_token_becomes_an_httponly_cookie_and_api_calls_need_no_header(browser, base):
    context = browser.new_context()
    try:
        tab = context.new_page()
        first = tab.goto(f"{base}/?token={ALICE}")
        assert tab.url == f"{base}/" and first.ok  # redirected: the token is in no URL
        csp = first.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        (cookie,) = context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
        assert tab.evaluate("document.cookie") == ""  # script never sees it
        status = "async p => (await fetch(p, {method: 'POST'})).status"
        assert tab.evaluate(status, "/api/sessions") == 201
        listed = tab.evaluate("async () => (await fetch('/api/sessions')).json()")
        assert len(listed) == 1
        assert tab.goto(f"{base}/?token=not-a-token").status == 401
    finally:
        context.close()
    anonymous = browser.new_context()
    try:
        tab = anonymous.new_page()
        assert tab.goto(f"{base}/").ok  # the page itself is open; its API calls are not
        assert tab.evaluate("async () => (await fetch('/api/sessions')).status") == 401
        tab.get_by_test_id("sessions").wait_for(state="attached")
        tab.wait_for_function(
            "() => document.getElementById('status').textContent.includes('token')"
        )
    finally:
        anonymous.close()


def start_serve(folder: Path) -> tuple[subprocess.Popen, str]:
    """`sandcell serve` as a person starts it, without --users: (the process, the URL it
    prints with the token)."""
    script = folder / "replies.json"
    script.write_text(json.dumps(["Final Answer: hello"]))
    proc = sandcell_process(
        "serve", "--port", str(free_port()), "--pool", "0", "--data", str(folder / "d"),
        "--replay", str(script), stderr=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    found = re.search(r"open (http://127\.0\.0\.1:\d+/\?token=\S+)", lines[1])
    if not found:
        proc.kill()
        raise AssertionError(f"the server did not print its URL: {lines}")
    return proc, found.group(1)


@pytest.mark.timeout(120)
def test_the_printed_url_signs_in_and_the_same_link_on_another_site_asks_for_a_click(
    browser, tmp_path
):
    proc, url = start_serve(tmp_path)
    base = url.split("/?", 1)[0]
    listed = "async () => (await fetch('/api/sessions')).status"
    try:
        typed = browser.new_context()  # the person opens the printed URL: signed in at once
        try:
            tab = typed.new_page()
            assert tab.goto(url).ok and tab.url == f"{base}/"
            assert [c["name"] for c in typed.cookies()] == ["sandcell_token"]
            assert tab.evaluate(listed) == 200
        finally:
            typed.close()
        linked = browser.new_context()  # the same URL as a link on another site
        try:
            link = f'<a id="go" href="{html.escape(url)}">cat pictures</a>'
            linked.route("http://evil.example/**", lambda route: route.fulfill(
                body=link, content_type="text/html"))  # fmt: skip
            tab = linked.new_page()
            tab.goto("http://evil.example/")
            tab.click("#go")
            tab.get_by_test_id("sign-in").wait_for(state="visible")
            assert tab.url == url and linked.cookies() == []  # not signed in by the link
            assert "another site" in tab.inner_text("main")
            tab.get_by_test_id("sign-in").click()  # the person's own click signs in
            tab.wait_for_url(f"{base}/")
            assert [c["name"] for c in linked.cookies()] == ["sandcell_token"]
            assert tab.evaluate(listed) == 200
        finally:
            linked.close()
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.timeout(60)
def test_page_headers_cookie_and_a_header_token_wins_over_the_cookie(base):
    with client(base, token=None) as anon:
        r = anon.get("/", params={"token": ALICE})
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert f"sandcell_token={ALICE}" in cookie and "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        page = anon.get("/")
        assert page.status_code == 200 and 'src="/static/page.js"' in page.text
        assert page.headers["content-security-policy"] == (
            "default-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; "
            "frame-ancestors 'none'"
        )
        assert "<script>" not in page.text and " on" not in page.text.replace(" one", "")
        assert anon.get("/static/page.js").status_code == 200
        assert anon.get("/", params={"token": "nope"}).status_code == 401
    with client(base, token=None) as cookied:
        cookied.cookies.set("sandcell_token", ALICE)
        assert cookied.get("/api/sessions").status_code == 200
        wrong = {"Authorization": "Bearer nope"}
        assert cookied.get("/api/sessions", headers=wrong).status_code == 401
        cookied.cookies.set("sandcell_token", "nope")
        assert cookied.get("/api/sessions").status_code == 401


@pytest.mark.docker
@pytest.mark.timeout(240)
def test_after_a_server_restart_a_reopened_session_shows_its_past_and_rebuilds(
    browser, model, tmp_path
):
    from playwright.sync_api import expect

    model.add(python("kept = 6 * 7\nkept"), "Final Answer: kept is 42")
    with serving(config(model, tmp_path / "data")) as base, client(base) as api:
        sid = api.post("/api/sessions").json()["id"]
        with api.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Keep 42"}) as r:
            r.read()
    model.add(python("kept + 1"), lambda body: "Final Answer: " + last_tool_message(body))
    with serving(config(model, tmp_path / "data")) as base:
        context = browser.new_context()
        try:
            tab = context.new_page()
            tab.set_default_timeout(WAIT_MS)
            tab.goto(f"{base}/?token={ALICE}")
            listed = tab.get_by_test_id("open-session")
            expect(listed).to_have_count(1)
            expect(listed).to_contain_text("from before a restart")
            listed.click()
            steps = tab.locator("#steps")
            expect(steps).to_contain_text("Keep 42")  # the past question and answer, shown again
            expect(tab.get_by_test_id("answer")).to_contain_text("kept is 42")
            expect(steps).to_contain_text("from before the server restarted")
            ask(tab, "And one more?")
            expect(steps).to_contain_text("kernel is rebuilt by re-running its 1 recorded cell")
            expect(tab.get_by_test_id("answer").last).to_contain_text("43")
        finally:
            context.close()
