"""The page's API beside the questions: what a cell's observation event shows (each output
once), the files the code made (listing, one download, the streamed zip and its caps), input
profiles, and titles. Real uvicorn, real sandboxes, the scripted model server."""

import io
import zipfile
from pathlib import Path

import pytest

from sandcell.agent.serve import outputs
from tests.scripted_server import ScriptedServer
from tests.serve_helpers import (
    BOB,
    ask,
    client,
    config,
    last_tool_message,
    new_session,
    python,
    serving,
    upload,
)

SALES = Path(__file__).parent / "data" / "agent" / "sales.csv"
MARKUP = "<img src=x onerror=window.pwned=1>.txt"  # no "/": a file name
CELL = (
    "import os, pandas as pd\n"
    "os.makedirs('/workspace/output', exist_ok=True)\n"
    "df = pd.read_csv('/data/sales.csv')\n"
    "print('printed-once-line')\n"
    "df.to_csv('/workspace/output/result.csv', index=False)\n"
    f"open('/workspace/output/{MARKUP}', 'w').write('x' * 3000)\n"
    "df.groupby('region').units.sum().to_frame()"
)


@pytest.fixture
def model():
    with ScriptedServer() as server:
        yield server


def asked(model, api, sid: str) -> list:
    model.add(python(CELL), lambda body: "Final Answer: " + last_tool_message(body)[:40])
    return ask(api, sid, "Sum the units by region and save the data")


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_observation_outputs_once_files_listed_zipped_profiles_titles_and_owners(
    model, tmp_path, monkeypatch
):
    data = tmp_path / "data"
    with serving(config(model, data)) as base, client(base) as api, client(base, BOB) as bob:
        sid = new_session(api)
        r = upload(api, sid, ("sales.csv", SALES.read_bytes()))
        assert r.status_code == 201, r.text
        assert "12 rows x 5 columns" in r.json()["profiles"]["sales.csv"]
        assert api.get(f"/api/sessions/{sid}/profiles").json() == r.json()["profiles"]
        assert r.json()["summaries"] == {"sales.csv": "12 rows × 5 columns, 0 missing"}
        assert api.get(f"/api/sessions/{sid}/summaries").json() == r.json()["summaries"]
        assert api.get(f"/api/sessions/{sid}/outputs").json()["zip"] is None
        assert api.get(f"/api/sessions/{sid}/outputs.zip").status_code == 404  # none made yet

        (obs,) = [d for kind, d in asked(model, api, sid) if kind == "observation"]
        # the model's text keeps everything; the page's parts show each output once
        assert "printed-once-line" in obs["text"] and "North" in obs["text"]
        assert obs["output"] == "printed-once-line\n"
        assert obs["results"] == [] and len(obs["tables"]) == 1 and "<table" in obs["tables"][0]
        assert obs["error"] is None and obs["notes"] == []

        listed = api.get(f"/api/sessions/{sid}/outputs").json()
        paths = [f["path"] for f in listed["files"]]
        assert sorted(paths) == sorted(["output/result.csv", f"output/{MARKUP}"])
        assert listed["total"] == 2 and listed["bytes"] == sum(f["size"] for f in listed["files"])
        newest = sorted(listed["files"], key=lambda f: f["modified"], reverse=True)
        assert [f["modified"] for f in listed["files"]] == [f["modified"] for f in newest]
        for f in listed["files"]:
            got = api.get(f["url"])
            assert got.status_code == 200 and len(got.content) == f["size"]
        csv = api.get(next(f["url"] for f in listed["files"] if f["path"].endswith(".csv")))
        assert csv.content.splitlines()[0] == b"date,region,product,units,unit_price"

        with api.stream("GET", listed["zip"]) as z:
            assert z.status_code == 200 and z.headers["content-type"] == "application/zip"
            assert "content-length" not in z.headers  # streamed as it is written
            assert z.headers["content-disposition"].startswith("attachment;")
            body = z.read()
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            assert sorted(archive.namelist()) == sorted(paths)
            assert archive.read("output/result.csv") == csv.content

        # caps: the listing counts what it does not list; the zip names what it left out
        monkeypatch.setattr(outputs, "MAX_LISTED", 1)
        monkeypatch.setattr(outputs, "ZIP_MAX_FILES", 1)
        capped = api.get(f"/api/sessions/{sid}/outputs").json()
        assert len(capped["files"]) == 1 and capped["total"] == 2
        with zipfile.ZipFile(io.BytesIO(api.get(listed["zip"]).content)) as archive:
            names = archive.namelist()
            assert names[0] == paths[0] and outputs.LEFT_OUT in names and len(names) == 2
            assert paths[1] in archive.read(outputs.LEFT_OUT).decode()
        monkeypatch.setattr(outputs, "ZIP_MAX_FILES", 100)
        monkeypatch.setattr(outputs, "ZIP_MAX_BYTES", 10)  # each file is over it
        with zipfile.ZipFile(io.BytesIO(api.get(listed["zip"]).content)) as archive:
            assert archive.namelist() == [outputs.LEFT_OUT]

        # titles: the first question by default, then the one given, one line
        info = api.get(f"/api/sessions/{sid}").json()
        assert info["title"] == "Sum the units by region and save the data"
        r = api.patch(f"/api/sessions/{sid}", json={"title": "Units\nby region  "})
        assert r.status_code == 200 and r.json()["title"] == "Units by region"
        assert api.get("/api/sessions").json()[0]["title"] == "Units by region"
        assert api.patch(f"/api/sessions/{sid}", json={"title": " \n"}).status_code == 422
        assert api.patch(f"/api/sessions/{sid}", json={"title": "x" * 201}).status_code == 422

        # another user's session is a missing one, on every new route
        for method, path in [
            ("PATCH", ""),
            ("GET", "/outputs"),
            ("GET", "/outputs.zip"),
            ("GET", "/profiles"),
            ("GET", "/summaries"),
        ]:
            body = {"title": "mine"} if method == "PATCH" else None
            r = bob.request(method, f"/api/sessions/{sid}{path}", json=body)
            assert r.status_code == 404, (method, path, r.text)
        assert client(base, token=None).get(f"/api/sessions/{sid}/outputs").status_code == 401
    # after a restart of the server: the title and the files are still there
    with serving(config(model, data)) as base, client(base) as api:
        (info,) = api.get("/api/sessions").json()
        assert info["title"] == "Units by region" and info["resumed"]
        assert api.get(f"/api/sessions/{sid}/outputs").json()["total"] == 2
