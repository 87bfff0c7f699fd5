"""`sandcell serve`'s HTTP API end to end: a real uvicorn on a loopback port, real sandboxes
from the server's pool, the real openai client against the scripted model server. Replies
that depend on what the sandbox computed are written from the observation the agent sent."""

import io
import json
import os
import signal
import subprocess
import time

import click
import docker
import docker.errors
import nbformat
import pandas as pd
import pytest

from sandcell.agent.hosting.server_options import users_of
from sandcell.agent.hosting.users import Users, UsersError, load_users
from sandcell.agent.serve.files import BadName, clean_name, parts_of
from sandcell.agent.serve.stream import table_html
from sandcell.sandbox import Execution, Limits
from tests.cli_runner import sandcell
from tests.containers import container_labels, owner_label
from tests.serve_helpers import (  # noqa: F401 (model: a fixture)
    BOB,
    CHART,
    SALES,
    ask,
    client,
    config,
    container_of,
    events,
    execute,
    last_tool_message,
    model,
    new_session,
    python,
    raw_get,
    serve_process,
    serving,
    upload,
    wait_for,
)

# a test's own timeout mark, where it has one, wins over the module's
pytestmark = pytest.mark.timeout(240)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def base(model, tmp_path):
    with serving(config(model, tmp_path / "data", max_upload_mb=1)) as url:
        yield url


def value(response) -> str:
    """text/plain of the cell's value in an execute's answer."""
    return next(r for r in response.json()["results"] if r["is_main"])["data"]["text/plain"]


def raw_upload(api, sid: str, filename: bytes, data: bytes):
    """A multipart body written by hand: the file name goes out byte for byte (httpx would
    percent-encode control characters before the server saw them)."""
    body = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" + filename
            + b"\"\r\nContent-Type: text/csv\r\n\r\n" + data + b"\r\n--b--\r\n")  # fmt: skip
    headers = {"content-type": "multipart/form-data; boundary=b"}
    return api.post(f"/api/sessions/{sid}/files", content=body, headers=headers)


# -- without a sandbox: auth, caps, names ----------------------------------------------------------


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
def test_health_and_openapi_are_open_every_api_route_needs_a_known_token(base):
    with client(base, token=None) as anon:
        assert anon.get("/api/health").json() == {"status": "ok"}
        paths = anon.get("/openapi.json").json()["paths"]
        assert {
            "/api/sessions",
            "/api/sessions/{id}/messages",
            "/api/sessions/{id}/execute",
        } <= set(paths)
        for method, path in [("GET", "/api/sessions"), ("POST", "/api/sessions"),
                             ("GET", "/api/sessions/abc/files"), ("POST", "/api/sessions/abc/execute")]:  # fmt: skip
            r = anon.request(method, path)
            assert r.status_code == 401 and "Bearer" in r.json()["error"], (method, path)
            assert r.headers["www-authenticate"] == "Bearer"
    with client(base, token="not-a-token-of-this-server") as wrong:
        r = wrong.get("/api/sessions")
        assert r.status_code == 401 and "not one of this server's" in r.json()["error"]
    with client(base) as api:
        assert api.get("/api/sessions").json() == []
        r = api.get("/api/sessions/0123456789abcdef")
        assert r.status_code == 404 and r.json() == {"error": "no session 0123456789abcdef"}
        assert api.get("/nowhere").json() == {"error": "Not Found"}


@pytest.mark.docker  # the server checks the engine as it starts
@pytest.mark.timeout(60)
def test_a_body_over_the_cap_is_413_as_json(base):
    with client(base) as api:
        r = api.post("/api/sessions/abc/messages", json={"content": "x" * (2 << 20)})
        assert r.status_code == 413 and "request body is over 1 MB" in r.json()["error"]
        r = api.post("/api/sessions/abc/files", content=b"y" * (2 << 20),
                     headers={"content-type": "multipart/form-data; boundary=b"})  # fmt: skip
        assert r.status_code == 413 and "--max-upload-mb" in r.json()["error"]


def test_a_user_s_line_may_narrow_the_server_s_allow_net_and_never_widen_it(tmp_path):
    users = tmp_path / "users"
    users.write_text(
        "alice:0123456789abcdef0123 allow-net=data.example.org,*.example.org:8443\n"
        "bob:fedcba9876543210fedc\n"
        "carol:abcdef0123456789abcd allow-net=internal:files.test:8080 allow-net=Data.Example.org\n"
    )
    read = load_users(users)
    assert read.tokens["bob"] == "fedcba9876543210fedc" and "bob" not in read.allow_net
    server = ("*.example.org", "*.example.org:8443", "internal:files.test:8080")
    assert read.narrowed(server) == {
        "alice": ("data.example.org", "*.example.org:8443"),
        "carol": ("internal:files.test:8080", "data.example.org"),
    }
    with pytest.raises(UsersError, match=r"alice's allow-net= names \*.example.org:8443, beyond"):
        read.narrowed(("*.example.org",))
    with pytest.raises(UsersError, match="which is not given; add --allow-net"):
        read.narrowed(())
    for line, said in [
        ("dave: allow-net=data.example.org", "as name:token"),  # the option is no token
        ("dave:0123456789abcdef0123 allow-net=", "is not an option of a user"),
        ("dave:0123456789abcdef0123 allownet=x.org", "is not an option of a user"),
        ("dave:0123 456789abcdef0123", "is not an option of a user"),  # a token has no space
        ("dave:0123456789abcdef0123 allow-net=bad_host!", "allow-net= of dave"),
    ]:
        users.write_text(line + "\n")
        with pytest.raises(UsersError, match=said) as refused:
            load_users(users)
        assert "456789abcdef" not in str(refused.value)  # no part of a token is said
    users.write_text("alice:0123456789abcdef0123 allow-net=data.example.org\n")
    with pytest.raises(
        click.UsageError, match="--users: allow-net= in a user's line is for sandcell serve"
    ):
        users_of(users, ("data.example.org",), narrows=False)
    with pytest.raises(
        click.UsageError, match="--users: user alice's allow-net= names data.example.org, beyond"
    ):
        users_of(users, ("example.org",))


def test_users_file_and_upload_names_and_download_paths(tmp_path):
    users = tmp_path / "users"
    users.write_text("# team\nalice: 0123456789abcdef0123\n\nbob:fedcba9876543210fedc\n")
    assert load_users(users) == Users(
        {"alice": "0123456789abcdef0123", "bob": "fedcba9876543210fedc"}
    )
    for text, said in [("alice\n", "name:token"), ("alice:\n", "name:token"), ("../x:0123456789abcdef0123\n", "user name"),
                       ("a:short\n", "shorter than 16"), ("a:0123456789abcdef0123\nb:0123456789abcdef0123\n", "another user's"),
                       ("", "names no users")]:  # fmt: skip
        users.write_text(text)
        with pytest.raises(UsersError, match=said):
            load_users(users)
    assert clean_name("sales.csv") == "sales.csv"
    assert clean_name("../../etc/passwd") == "passwd"
    assert clean_name("C:\\Users\\me\\data.csv") == "data.csv"
    for bad in ["", "..", "dir/..", ".env", "a\x00b.csv", "tab\there.csv", "x" * 300]:
        with pytest.raises(BadName):
            clean_name(bad)
    cleaned = table_html('<style>td{}</style><table class="dataframe" border="1"><tr>'
                         '<td onmouseover="x()" colspan="2">1<script>y()</script></td></tr></table>')  # fmt: skip
    assert cleaned == '<table><tbody><tr><td colspan="2">1</td></tr></tbody></table>'
    assert parts_of("figures/figure-1.png") == ("figures", "figure-1.png")
    for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", ".collect-x/f", "a/\x01"]:
        assert parts_of(bad) is None


# -- with sandboxes ---------------------------------------------------------------------------------


@pytest.mark.docker
def test_upload_a_csv_then_a_question_streams_its_steps_with_chart_table_and_notebook(model, base):
    model.add(
        {"content": "Summing units per region.", "tool_calls": [{"name": "python", "arguments": {"code": CHART}}]},
        lambda body: "Final Answer: most units: " + last_tool_message(body).split("\n")[0],
    )  # fmt: skip
    truth = pd.read_csv(SALES).groupby("region").units.sum()
    with client(base) as api:
        sid = new_session(api)
        r = upload(api, sid, ("sales.csv", SALES.read_bytes()))
        assert r.status_code == 201, r.text
        assert r.json()["names"] == r.json()["inputs"] == ["sales.csv"]
        assert "12 rows x 5 columns" in r.json()["profiles"]["sales.csv"]
        started = time.monotonic()
        got = ask(api, sid, "Which region sold the most units?")
        kinds = [k for k, _ in got]
        assert kinds.index("action") < kinds.index("observation") < kinds.index("answer")
        assert kinds[-1] == "answer" and "token" in kinds and "thought" in kinds
        action = dict(got)["action"]
        assert action["tool"] == "python" and "/data/sales.csv" in json.dumps(action["args"])
        obs = dict(got)["observation"]
        assert obs["ok"] and f"{truth.idxmax()} {truth.max()}" in obs["text"]
        assert len(obs["figures"]) == 1 and "<table" in obs["tables"][0]
        assert obs["table_data"][0]["rows"] == [[int(v)] for v in truth.values]  # its data too
        assert [b["value"] for b in obs["charts"][0]["elements"]] == list(truth.values)
        assert "<style" not in obs["tables"][0] and "North" in obs["tables"][0]
        final = got[-1][1]
        assert final["answer"] == f"most units: {truth.idxmax()} {truth.max()}"
        assert final["stop_reason"] == "answered" and final["steps"] == 2
        chart = api.get(obs["figures"][0])
        assert chart.status_code == 200 and chart.content.startswith(PNG)
        assert chart.headers["content-type"] == "image/png"
        assert chart.headers["x-content-type-options"] == "nosniff"
        listed = {f["path"]: f for f in api.get(f"/api/sessions/{sid}/files").json()["files"]}
        assert listed["inputs/sales.csv"]["kind"] == "input"
        assert listed["figures/figure-1.png"]["url"] == obs["figures"][0]
        nb = api.get(f"/api/sessions/{sid}/notebook")
        assert nb.status_code == 200 and "attachment" in nb.headers["content-disposition"]
        notebook = nbformat.reads(nb.text, as_version=4)
        nbformat.validate(notebook)
        assert any(c.cell_type == "code" and c.source == CHART for c in notebook.cells)
        trace = [
            json.loads(line) for line in api.get(f"/api/sessions/{sid}/trace").text.splitlines()
        ]
        assert trace[0]["type"] == "session" and trace[-1]["type"] == "final"
        assert [e for e in trace if e["type"] == "inputs"][0]["added"][0]["name"] == "sales.csv"
        assert final["answer_html"] == f"<p>{final['answer']}</p>\n"  # the page's Markdown
        assert api.get(f"/api/sessions/{sid}/history").json() == [
            {"question": "Which region sold the most units?", "answer": final["answer"],
             "stop_reason": "answered", "answer_html": final["answer_html"]}
        ]  # fmt: skip
        info = api.get("/api/sessions").json()
        assert [s["id"] for s in info] == [sid] and info[0]["questions"] == 1
        print(f"question answered in {time.monotonic() - started:.2f} s")


@pytest.mark.docker
def test_another_users_session_and_its_files_answer_404(base):
    with client(base) as alice, client(base, BOB) as bob:
        sid = new_session(alice)
        assert upload(alice, sid, ("sales.csv", SALES.read_bytes())).status_code == 201
        for method, path in [("GET", f"/api/sessions/{sid}"), ("GET", f"/api/sessions/{sid}/files"),
                             ("GET", f"/api/sessions/{sid}/files/inputs/sales.csv"),
                             ("GET", f"/api/sessions/{sid}/notebook"), ("GET", f"/api/sessions/{sid}/trace"),
                             ("GET", f"/api/sessions/{sid}/history"),
                             ("POST", f"/api/sessions/{sid}/interrupt"), ("DELETE", f"/api/sessions/{sid}")]:  # fmt: skip
            r = bob.request(method, path)
            assert r.status_code == 404 and r.json() == {"error": f"no session {sid}"}, path
        r = bob.post(f"/api/sessions/{sid}/execute", json={"code": "1"})
        assert r.status_code == 404
        assert bob.get("/api/sessions").json() == []
        assert (
            alice.get(f"/api/sessions/{sid}/files/inputs/sales.csv").content == SALES.read_bytes()
        )


@pytest.mark.docker
def test_execute_returns_the_execution_and_keeps_kernel_state(base):
    with client(base) as api:
        sid = new_session(api)
        first = "x = 6 * 7\nprint('hi')\nx"
        r = execute(api, sid, first)
        assert r.status_code == 200
        ex = Execution.from_dict(r.json())
        assert ex.ok and ex.stdout == "hi\n" and ex.text == "42"
        ex = Execution.from_dict(execute(api, sid, "x / 0").json())
        assert not ex.ok and ex.error.name == "ZeroDivisionError"
        assert execute(api, sid, "import time; time.sleep(5)", timeout=1).json()["timed_out"]
        assert value(execute(api, sid, "x")) == "42"
        for bad, field in [({}, "code"), ({"code": 1}, "code"), ({"code": "1", "timeout": 0}, "timeout")]:  # fmt: skip
            r = api.post(f"/api/sessions/{sid}/execute", json=bad)
            assert r.status_code == 422 and f"body.{field}" in r.json()["error"], r.text
        notebook = nbformat.reads(api.get(f"/api/sessions/{sid}/notebook").text, as_version=4)
        cells = [c.source for c in notebook.cells if c.cell_type == "code"]
        assert cells[0] == first and len(cells) == 4


@pytest.mark.docker
def test_one_message_at_a_time_409_and_interrupt_stops_the_running_cell(model, base):
    model.add(python("import time\nprint('sleeping', flush=True)\ntime.sleep(120)"),
              lambda body: "Final Answer: stopped: " + last_tool_message(body)[-60:])  # fmt: skip
    with client(base) as api, client(base) as other:
        sid = new_session(api)
        container_of(api, sid)  # the sandbox is up: the cell starts right after its action
        assert other.post(f"/api/sessions/{sid}/interrupt").json() == {"interrupted": False}
        with api.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "sleep"}) as r:
            stream = events(r)
            seen = [next(k for k, _ in stream if k == "action")]
            # the cell's print arrives while it runs: it is sleeping now
            seen += [next(d["text"] for k, d in stream if k == "output")]
            assert seen == ["action", "sleeping\n"]
            again = other.post(f"/api/sessions/{sid}/messages", json={"content": "again"})
            assert again.status_code == 409 and "running" in again.json()["error"]
            assert other.post(f"/api/sessions/{sid}/execute", json={"code": "1"}).status_code == 409
            assert other.get(f"/api/sessions/{sid}").json()["running"] is True
            stopped_at = time.monotonic()
            assert other.post(f"/api/sessions/{sid}/interrupt").json() == {"interrupted": True}
            rest = list(stream)
        took = time.monotonic() - stopped_at
        obs = next(d for k, d in rest if k == "observation")
        assert (
            obs["execution"]["interrupted"]
            and obs["execution"]["error"]["name"] == "KeyboardInterrupt"
        )
        assert rest[-1][0] == "answer" and "KeyboardInterrupt" in rest[-1][1]["answer"]
        assert took < 20, took
        # the claim is given back with the answer: the next message goes through
        model.add("Final Answer: awake")
        assert ask(api, sid, "still there?")[-1][1]["answer"] == "awake"
        # a client that goes away mid-question stops it: cell interrupted, no next model call
        model.add(python("import time\ntime.sleep(120)"), "Final Answer: never asked for")
        with api.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "go"}) as r:
            next(k for k, _ in events(r) if k == "action")
        wait_for(lambda: api.get(f"/api/sessions/{sid}").json()["running"] is False, 20)
        assert model.left() == 1


@pytest.mark.docker
def test_uploads_over_the_cap_413_bad_names_400_taken_names_409(base, tmp_path):
    with client(base) as api:
        sid = new_session(api)
        big = upload(api, sid, ("big.csv", b"a,b\n" + b"1,2\n" * (400 << 10)))
        assert big.status_code == 413 and "over 1 MB (--max-upload-mb)" in big.json()["error"]
        for name in [b".hidden.csv", b"..", b"a\x07b.csv", b"a\x1b[31mred.csv", b"", b"dir/.."]:
            r = raw_upload(api, sid, name, b"x\n")
            assert r.status_code == 400, (name, r.text)
            assert "name" in r.json()["error"]
        r = upload(api, sid, ("../../up.csv", b"x\n1\n"))
        assert r.status_code == 201 and r.json()["names"] == ["up.csv"]
        r = upload(api, sid, ("up.csv", b"other\n"))
        assert r.status_code == 409 and "up.csv is there already" in r.json()["error"]
        r = upload(api, sid, ("twice.csv", b"1\n"), ("twice.csv", b"2\n"))
        assert r.status_code == 409
        r = api.post(f"/api/sessions/{sid}/files", data={"not_file": "x"})
        assert r.status_code == 422 and "file" in r.json()["error"]
        names = [f["path"] for f in api.get(f"/api/sessions/{sid}/files").json()["files"]]
        assert names == ["inputs/up.csv"]  # nothing of a refused upload is left
        assert value(execute(api, sid, "open('/data/up.csv').read()")) == repr("x\n1\n")


@pytest.mark.docker
def test_files_route_is_confined_to_the_session_folder(base, tmp_path):
    data = tmp_path / "data"
    (data / "secret.txt").write_text("not yours")
    with client(base) as api, client(base, BOB) as bob:
        sid = new_session(api)
        other = new_session(bob)
        (data / "bob" / other / "inputs" / "b.csv").write_text("bob's\n")
        folder = data / "alice" / sid
        (folder / "output").mkdir()
        os.symlink(data / "secret.txt", folder / "output" / "link.txt")
        os.symlink(data / "bob" / other, folder / "output" / "bobs")
        os.symlink("/etc", folder / "etc")
        (folder / "output" / "fine.txt").write_text("ok")
        root = f"/api/sessions/{sid}/files"
        assert raw_get(base, f"{root}/output/fine.txt") == (200, b"ok")
        for path in [
            "../secret.txt", "../../secret.txt", "%2e%2e/%2e%2e/secret.txt", "..%2f..%2fsecret.txt",
            f"../../bob/{other}/inputs/b.csv", "%2e%2e%2f%2e%2e%2fbob%2f" + other + "%2finputs%2fb.csv",
            "/etc/passwd", "%2fetc%2fpasswd", "//etc/passwd", "output/link.txt", "output/bobs/inputs/b.csv",
            "etc/passwd", "output/../output/fine.txt", "./output/fine.txt", "output/", "output",
            "trace.jsonl/x", ".collect-x", "output%00/fine.txt",
        ]:  # fmt: skip
            status, body = raw_get(base, f"{root}/{path}")
            assert status == 404, (path, status, body)
            assert b"not yours" not in body and b"root:" not in body
        listed = [f["path"] for f in api.get(root).json()["files"]]
        assert listed == ["output/fine.txt"]


@pytest.mark.docker
def test_delete_removes_the_container_and_the_folder_even_mid_question(model, base, tmp_path):
    engine = docker.from_env()
    model.add(python("import time\ntime.sleep(120)"), "Final Answer: never asked for")
    with client(base) as api, client(base) as other:
        sid = new_session(api)
        container = container_of(api, sid)
        assert engine.containers.get(container).status == "running"
        with api.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "sleep"}) as r:
            stream = events(r)
            next(k for k, _ in stream if k == "action")
            time.sleep(1)
            deleted = other.delete(f"/api/sessions/{sid}")
            rest = list(stream)
        assert deleted.status_code == 204 and deleted.content == b""
        assert rest[-1][0] == "answer" and rest[-1][1]["stop_reason"] == "interrupted"
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(container)
        assert not (tmp_path / "data" / "alice" / sid).exists()
        assert api.get(f"/api/sessions/{sid}").status_code == 404
        assert api.delete(f"/api/sessions/{sid}").status_code == 404
        assert api.get("/api/sessions").json() == []


@pytest.mark.docker
def test_table_html_is_sanitized_and_a_model_error_ends_the_stream_with_error(model, base):
    hostile = (
        "from IPython.display import HTML, display\n"
        'display(HTML(\'<table onclick="alert(1)"><tr><td style="x">1<img src=x onerror=alert(2)>\''
        "'<script>alert(3)</script></td></tr></table><a href=\"javascript:alert(4)\">x</a>'))"
    )
    model.add(python(hostile), "Final Answer: shown", {"error": 401, "message": "bad key"})
    with client(base) as api:
        sid = new_session(api)
        got = ask(api, sid, "show it")
        table = next(d for k, d in got if k == "observation")["tables"][0]
        assert "<table>" in table and "<td>1" in table
        for bad in ["onclick", "onerror", "<img", "<script", "alert(3)", "javascript", "style"]:
            assert bad not in table, bad
        failed = ask(api, sid, "again")
        assert failed[-1][0] == "error"
        assert failed[-1][1]["stop_reason"] == "model_error" and failed[-1][1]["answer"] is None
        assert "bad key" in failed[-1][1]["error"] and "steps" in failed[-1][1]


@pytest.mark.docker
def test_past_max_sessions_503_with_retry_after_until_one_is_deleted(model, tmp_path):
    with (
        serving(
            config(model, tmp_path / "d", max_sessions=2, max_sessions_per_user=2, idle_minutes=10)
        ) as base,
        client(base) as api,
    ):
        first, second = new_session(api), new_session(api)
        full = api.post("/api/sessions")
        assert full.status_code == 503 and "--max-sessions" in full.json()["error"]
        assert 590 <= int(full.headers["retry-after"]) <= 631  # when the first goes idle
        assert api.delete(f"/api/sessions/{first}").status_code == 204
        assert api.post("/api/sessions").status_code == 201
        assert second


@pytest.mark.docker
def test_an_idle_session_releases_its_container_and_the_next_cell_gets_a_fresh_one(model, tmp_path):
    engine = docker.from_env()
    runc = Limits(timeout_s=30, runtime="runc")  # the engine's default may be runsc
    with (
        serving(config(model, tmp_path / "d", idle_minutes=0.05, limits=runc)) as base,
        client(base) as api,
    ):
        sid = new_session(api)
        assert upload(api, sid, ("sales.csv", SALES.read_bytes())).status_code == 201
        code = "import os\nos.makedirs('/workspace/output', exist_ok=True)\nopen('/workspace/output/kept.txt', 'w').write('kept')\nx = 1"  # fmt: skip
        first = container_of(api, sid)
        assert execute(api, sid, code).json()["error"] is None
        wait_for(lambda: api.get(f"/api/sessions/{sid}").json()["sandbox"] == "released", 30)
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(first)
        assert (tmp_path / "d" / "alice" / sid / "output" / "kept.txt").read_text() == "kept"
        assert upload(api, sid, ("late.csv", b"a\n1\n")).status_code == 201  # no sandbox now
        assert api.get(f"/api/sessions/{sid}").json()["sandbox"] == "released"
        r = execute(api, sid, "x")
        warning = r.headers["x-sandcell-warning"]
        assert "kernel starts fresh" in warning and "only a sandbox under gVisor" in warning
        assert r.json()["error"]["name"] == "NameError"
        back = "open('/workspace/output/kept.txt').read(), len(open('/data/sales.csv').readlines()), open('/data/late.csv').read()"  # fmt: skip
        r = execute(api, sid, back)
        assert value(r) == "('kept', 13, 'a\\n1\\n')"
        assert "x-sandcell-warning" not in r.headers
        kinds = [json.loads(line)["type"] for line in api.get(f"/api/sessions/{sid}/trace").text.splitlines()]  # fmt: skip
        assert kinds.index("sandbox_released") < kinds.index("reset")


@pytest.mark.docker
def test_files_added_to_a_running_session_reach_its_sandbox_and_the_model(model, base):
    with client(base) as api:
        sid = new_session(api)
        assert upload(api, sid, ("sales.csv", SALES.read_bytes())).status_code == 201
        code = "import pandas as pd\ndf = pd.read_csv('/data/sales.csv')\nlen(df)"
        assert value(execute(api, sid, code)) == "12"
        more = io.BytesIO(b"city,people\nOslo,709000\nBergen,291000\n").getvalue()
        assert upload(api, sid, ("cities.csv", more)).status_code == 201
        model.add({"tool_calls": [{"name": "file_metadata", "arguments": {"path": "/data/cities.csv"}}]},
                  python("len(df), int(pd.read_csv('/data/cities.csv').people.sum())"),
                  lambda body: "Final Answer: " + last_tool_message(body))  # fmt: skip
        got = ask(api, sid, "How many people, and is df still there?")
        assert got[-1][1]["answer"] == "(12, 1000000)"
        system = model.requests[-1]["messages"][0]["content"]
        assert "/data/cities.csv" in system and "/data/sales.csv" in system
        profile = [d for k, d in got if k == "observation"][0]
        assert profile["ok"] and "people" in profile["text"]


@pytest.mark.docker
def test_sandcell_serve_on_sigterm_removes_every_container(tmp_path):
    proc, base = serve_process(tmp_path, ["Final Answer: hello"], "--pool", "1")
    try:
        with client(base) as api:
            sid = new_session(api)
            container_of(api, sid)
            assert ask(api, sid, "hi")[-1][1]["answer"] == "hello"
            wait_for(lambda: len(container_labels(owner_label(proc.pid))) == 2)  # and the warm one
        # a second server on the same --data is refused: it would resume the same sessions
        second = sandcell(
            "serve", "--port", "0", "--data", str(tmp_path / "d"), "--users",
            str(tmp_path / "users"), "--replay", str(tmp_path / "replies.json"), timeout=60,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert f"is in use by another sandcell serve (pid {proc.pid})" in second.stderr
        assert "Traceback" not in second.stderr
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert container_labels(owner_label(proc.pid)) == []


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_restarted_server_lists_its_sessions_and_continuing_one_rebuilds_the_kernel(
    model, tmp_path
):
    data, runc = tmp_path / "d", Limits(timeout_s=30, runtime="runc")  # never paused
    with serving(config(model, data, limits=runc)) as base, client(base) as api:
        sid = new_session(api)
        assert upload(api, sid, ("sales.csv", SALES.read_bytes())).status_code == 201
        code = "import pandas as pd\ndf = pd.read_csv('/data/sales.csv')\ntotal = int(df.units.sum())\nopen('/workspace/log.txt', 'a').write('x')"  # fmt: skip
        assert execute(api, sid, code).json()["error"] is None
        endless = execute(api, sid, "while True: pass", timeout=1).json()
        assert endless["timed_out"] and not endless["restarted"]
        model.add(python("total * 2"), lambda body: "Final Answer: " + last_tool_message(body))
        first = ask(api, sid, "Twice the units?")[-1][1]["answer"]
        untouched = new_session(api)  # no cell ran: continued without a rebuild
    assert first == str(2 * int(pd.read_csv(SALES).units.sum()))

    with serving(config(model, data, limits=runc)) as base, client(base) as api:
        listed = {s["id"]: s for s in api.get("/api/sessions").json()}
        assert set(listed) == {sid, untouched}
        assert listed[sid]["resumed"] and listed[sid]["questions"] == 1
        assert listed[sid]["inputs"] == ["sales.csv"] and listed[sid]["sandbox"] == "released"
        with client(base, BOB) as bob:
            assert bob.get("/api/sessions").json() == []
            assert bob.get(f"/api/sessions/{sid}").status_code == 404

        r = execute(api, sid, "total, len(df), open('/workspace/log.txt').read()")
        assert r.json()["error"] is None, r.json()
        warning = r.headers["x-sandcell-warning"]
        assert "kernel is rebuilt by re-running its 3 recorded cell(s)" in warning
        # under runc its kernel could not be paused as the server stopped: said, and why
        assert "could not be paused: only a sandbox under gVisor" in warning, warning
        assert value(r) == f"({int(pd.read_csv(SALES).units.sum())}, 12, 'x')"
        assert "x-sandcell-warning" not in execute(api, sid, "1").headers
        # the conversation goes on: the model sees the question asked before the restart
        model.add("Final Answer: noted")
        assert ask(api, sid, "And now?")[-1][1]["answer"] == "noted"
        said = [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "user"]
        assert said[0] == "Twice the units?" and said[-1] == "And now?"
        assert api.get(f"/api/sessions/{sid}").json()["questions"] == 2

        trace = [json.loads(x) for x in api.get(f"/api/sessions/{sid}/trace").text.splitlines()]
        rebuilt = [e for e in trace if e["type"] == "rebuilt"]
        assert [(e["cells"], e["skipped"]) for e in rebuilt] == [(3, 1)]
        notebook = nbformat.reads(api.get(f"/api/sessions/{sid}/notebook").text, as_version=4)
        nbformat.validate(notebook)
        text = "\n".join(c.source for c in notebook.cells)
        assert "continued here" in text and "rebuilt here" in text and "## Question 2" in text

        assert "x-sandcell-warning" not in execute(api, untouched, "1").headers
        assert api.delete(f"/api/sessions/{untouched}").status_code == 204
        assert not (data / "alice" / untouched).exists()


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_sigkill_of_the_server_then_a_restart_leaves_no_container_and_loses_no_session(tmp_path):
    def start() -> tuple[subprocess.Popen, str]:
        return serve_process(tmp_path, ["Final Answer: hello"], "--pool", "1")

    killed, base = start()
    try:
        with client(base) as api:
            sid = new_session(api)
            assert execute(api, sid, "kept = 6 * 7").json()["error"] is None
            wait_for(lambda: len(container_labels(owner_label(killed.pid))) == 2)
    finally:
        killed.kill()
        killed.communicate(timeout=30)
    assert len(container_labels(owner_label(killed.pid))) == 2  # left behind by the kill

    again, base = start()
    try:
        with client(base) as api:
            wait_for(lambda: api.get("/api/health").status_code == 200, 30)
            assert container_labels(owner_label(killed.pid)) == []
            assert [s["id"] for s in api.get("/api/sessions").json()] == [sid]
            assert value(execute(api, sid, "kept")) == "42"
        again.send_signal(signal.SIGTERM)
        out, err = again.communicate(timeout=90)
    finally:
        again.kill()
    assert again.returncode == 143, err
    assert container_labels(owner_label(again.pid)) == []


def test_a_warning_goes_into_its_header_as_one_line_of_ascii():
    """A warning that carries an engine's multi-line error, a control character or a file name
    in any script must not make the server refuse its own response after the cell ran
    (h11: "Illegal header value", seen in a CI run)."""
    import h11

    from sandcell.agent.serve.routes import header_text

    warning = "could not be paused: the engine said\nError: \x1b[31mno\x1b[0m for café.csv 数据"
    value = header_text(warning)
    h11.Response(status_code=200, headers=[("X-Sandcell-Warning", value)])  # raises if illegal
    assert value == (
        "could not be paused: the engine said\\nError: \\x1b[31mno\\x1b[0m for "
        "caf\\xe9.csv \\u6570\\u636e"
    )
    assert header_text("a plain warning (it could not be paused)") == (
        "a plain warning (it could not be paused)"
    )
