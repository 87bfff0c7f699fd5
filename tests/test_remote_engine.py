"""Whole sessions against an engine reached over TCP (DOCKER_HOST=tcp://..., as a remote
engine is): `auto` picks the stream transport, so every kernel message, input and output goes
through the engine's API, with no bind mount. A chat session of `serve` (an uploaded CSV, a
chart, a file downloaded), a batch of four checked jobs, and two `serve` sessions at once.
Real uvicorn, real sandboxes, the real openai client against the scripted model server."""

import re
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pandera.pandas as pa
import pytest

from sandcell import OpenAIModel
from sandcell.agent.jobs.batch import Batch, JobSettings, ThreadExecutor, load_jobs
from sandcell.sandbox import Execution, Limits, boundary
from sandcell.sandbox.docker_sandbox import DockerSandbox
from tests.serve_helpers import (  # noqa: F401 (model: a fixture)
    SALES,
    ask,
    client,
    config,
    container_of,
    execute,
    last_tool_message,
    model,
    new_session,
    python,
    serving,
    upload,
)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def remote(monkeypatch, tcp_engine) -> list[DockerSandbox]:
    """DOCKER_HOST set to the engine over TCP for this test; the list of every sandbox made
    in this process during it (each as it came out of its start, nothing else changed)."""
    monkeypatch.setenv("DOCKER_HOST", tcp_engine)
    made: list[DockerSandbox] = []
    init = DockerSandbox.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(DockerSandbox, "__init__", recorded)
    return made


def assert_streamed(boxes: list[DockerSandbox], tcp_engine: str) -> None:
    """Each sandbox was reached over the stream transport, chosen because the engine is
    remote, and its container has no bind mount: its volumes only (the bridge's key folder,
    and the inputs' on /data where it has inputs)."""
    assert boxes, "no sandbox was made"
    for box in boxes:
        assert box.streamed and box.transport.name == "stream", box.transport
        assert box.transport.why == f"the engine is remote ({tcp_engine})"
        mounts = box.container.attrs["Mounts"]  # as inspected once the container started
        assert [m for m in mounts if m["Type"] == "bind"] == [], mounts
        found = {m["Destination"]: (m["Type"], m["Name"]) for m in mounts}
        key = found.pop(boundary.KEY_DIR)  # the bridge's folder: a volume in memory
        assert key[0] == "volume" and key[1].startswith("sandcell-key-"), mounts
        assert found in ({}, {"/data": ("volume", box.volume)}), mounts


def short_ids(boxes: list[DockerSandbox]) -> set[str]:
    return {box.container.id[:12] for box in boxes}


SUMMARY = (
    "import os, pandas as pd, matplotlib.pyplot as plt\n"
    "df = pd.read_csv('/data/sales.csv')\n"
    "units = df.groupby('region').units.sum()\n"
    "units.plot.bar(); plt.show()\n"
    "os.makedirs('/workspace/output', exist_ok=True)\n"
    "units.to_csv('/workspace/output/units.csv')\n"
    "print(units.idxmax(), units.max())"
)


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_a_chat_over_tcp_reads_an_upload_draws_a_chart_and_its_file_downloads(
    model, remote, tcp_engine, tmp_path
):
    """A serve session on the remote engine: the uploaded CSV reaches /data through the
    volume, the model's cell answers from it, its chart comes back as a figure and the file
    it wrote downloads byte for byte; the sandbox was streamed, with no bind mount."""
    model.add(
        python(SUMMARY),
        lambda body: "Final Answer: most units: " + last_tool_message(body).split("\n")[0],
    )
    truth = pd.read_csv(SALES).groupby("region").units.sum()
    with serving(config(model, tmp_path / "data")) as base, client(base) as api:
        sid = new_session(api)
        r = upload(api, sid, ("sales.csv", SALES.read_bytes()))
        assert r.status_code == 201, r.text
        got = ask(api, sid, "Which region sold the most units? Save the sums.")
        final = got[-1][1]
        assert got[-1][0] == "answer" and final["stop_reason"] == "answered", got[-1]
        assert final["answer"] == f"most units: {truth.idxmax()} {truth.max()}"
        obs = dict(got)["observation"]
        assert obs["ok"] and len(obs["figures"]) == 1, obs
        chart = api.get(obs["figures"][0])
        assert chart.status_code == 200 and chart.content.startswith(PNG)

        listed = {f["path"]: f for f in api.get(f"/api/sessions/{sid}/outputs").json()["files"]}
        assert sorted(listed) == ["figures/figure-1.png", "output/units.csv"], listed
        assert listed["figures/figure-1.png"]["size"] == len(chart.content)
        saved = api.get(listed["output/units.csv"]["url"])
        assert saved.status_code == 200
        assert saved.content.decode() == truth.to_csv()

        assert container_of(api, sid) in short_ids(remote)
        assert_streamed(remote, tcp_engine)
        assert any(box.volume for box in remote)  # the upload went into a volume


CLEAN = (
    "import os, pandas as pd\n"
    "df = pd.read_csv('/data/{name}').drop_duplicates()\n"
    "df = df[df.amount >= 0]\n"
    "os.makedirs('/workspace/output', exist_ok=True)\n"
    "df.to_csv('/workspace/output/clean.csv', index=False)\n"
    "print(len(df))"
)


def messy(i: int) -> pd.DataFrame:
    """Job i's input: i + 3 good rows, one of them twice, and one negative amount."""
    good = [(n, 10.0 * (n + 1) + i, "NS"[n % 2]) for n in range(i + 3)]
    rows = good + [good[0], (99, -1.0, "N")]
    return pd.DataFrame(rows, columns=["id", "amount", "region"])


def job_reply(body: dict) -> dict | str:
    """The model of every job: clean the job's own input, then answer with what was kept."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if any(m["role"] == "tool" for m in body["messages"]):
        return f"Final Answer: kept {last_tool_message(body).strip()} rows."
    return python(CLEAN.format(name=re.search(r"in-\d\.csv", task)[0]))


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_a_batch_of_four_checked_jobs_over_tcp_passes_and_copies_each_output_back(
    model, remote, tcp_engine, tmp_path
):
    """Four jobs, four workers, on the remote engine: each job's input is copied into its
    sandbox's volume, its cleaned output passes the declared schema and comes back to the
    host with the right rows; every sandbox was streamed, none had a bind mount."""
    schema = pa.DataFrameSchema(
        {"id": pa.Column(int, unique=True), "amount": pa.Column(float, pa.Check.ge(0))},
        coerce=True,
    )
    (tmp_path / "schema.yaml").write_text(schema.to_yaml())
    lines = []
    for i in range(4):
        messy(i).to_csv(tmp_path / f"in-{i}.csv", index=False)
        lines.append(
            f'{{"id": "job-{i}", "task": "Clean in-{i}.csv into output/clean.csv", '
            f'"inputs": ["in-{i}.csv"], "expect": {{"output/clean.csv": "schema.yaml"}}}}'
        )
    (tmp_path / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    model.add(*[job_reply] * 8)  # two requests a job, in whatever order the jobs run
    out = tmp_path / "out"
    executor = ThreadExecutor(
        4,
        JobSettings(Limits(timeout_s=30), protocol="tools"),
        lambda job: OpenAIModel("scripted", base_url=model.url, api_key="k", retry_base_s=0.01),
    )
    records = Batch(load_jobs(tmp_path / "jobs.jsonl"), out, executor, progress=False).run()

    assert sorted(r["id"] for r in records) == [f"job-{i}" for i in range(4)]
    for record in records:
        i = int(record["id"][-1])
        expected = messy(i).drop_duplicates().query("amount >= 0")
        assert record["status"] == "answered", record
        assert record["checks"]["passed"] is True, record["checks"]
        assert record["answer"] == f"kept {len(expected)} rows."
        copied = out / record["id"] / "output" / "clean.csv"
        assert copied.read_text() == expected.to_csv(index=False)
    assert_streamed(remote, tcp_engine)
    assert len(short_ids(remote)) >= 4  # a sandbox of its own for each job at once


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_two_serve_sessions_at_once_over_tcp_each_have_their_own_sandbox_and_state(
    model, remote, tcp_engine, tmp_path
):
    """Two sessions of one server on the remote engine, their cells run at the same time:
    two containers, and what one session defines the other never sees."""
    with serving(config(model, tmp_path / "data")) as base, client(base) as api:
        sids = [new_session(api), new_session(api)]

        def run(sid: str, code: str) -> Execution:
            r = execute(api, sid, code)
            assert r.status_code == 200, r.text
            return Execution.from_dict(r.json())

        with ThreadPoolExecutor(2) as pool:
            made = list(pool.map(run, sids, ["who = 'first'", "who = 'second'; only = 2"]))
            assert [ex.ok for ex in made] == [True, True], made
            read = list(pool.map(run, sids, ["print(who)"] * 2))
        assert [ex.stdout for ex in read] == ["first\n", "second\n"], read
        assert run(sids[0], "only").error.name == "NameError"
        assert run(sids[1], "print(only)").stdout == "2\n"

        containers = [container_of(api, sid) for sid in sids]
        assert containers[0] != containers[1]
        assert set(containers) <= short_ids(remote)
        assert_streamed(remote, tcp_engine)
