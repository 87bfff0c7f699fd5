"""`sandcell batch --ray` on a real Ray cluster on this machine: two nodes on loopback
(ray.cluster_utils), each declaring `sandcell: 1`, real sandboxes, scripted replies. Each test
starts its own small cluster (no dashboard, 100 MB object store per node) and tears it down."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from sandcell.agent.jobs.fingerprint import Layout
from sandcell.agent.records.trace import read_trace
from sandcell.sandbox.wheelhouse import Wheelhouse, add
from tests.cli_runner import sandcell, sandcell_process
from tests.deliveries import (
    FAMILIES,
    SAVE,
    FamilyModel,
    delivery,
    library_recipe,
)
from tests.loopback import FILES_HOST, Files, need_test_hosts, tcp_server
from tests.missing import IN_CI
from tests.otlp_receiver import receiving
from tests.polling import kill_after_results, wait_for
from tests.realdata import CSVS
from tests.scripted_server import ScriptedServer
from tests.wheels import make_wheel

try:
    from sandcell.agent.jobs.ray_batch import (
        SCRATCH_LOCK,
        SCRATCH_PREFIX,
        dead_scratch,
        remove_dead_scratch,
        scratch_folder,
    )
    from tests.ray_cluster import job_task_workers, ray_cluster  # imports Ray
except ImportError:  # `make test` installs it; with CI=true a missing Ray is a failure
    if IN_CI:
        raise
    pytest.skip("ray is not installed: pip install -e '.[ray]'", allow_module_level=True)

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("ray")]  # one cluster at a time
NODE = {"num_cpus": 1, "resources": {"sandcell": 1}, "object_store_memory": 100 << 20}
# one batch as a subprocess: the twelve jobs' test took 195 s under load (a 2-core machine, the
# parallel suite beside it and one more CPU hog)
BATCH_S = 300
KEY = "sk-ray-test-6f1c0e9b2d"  # must reach the node, and appear nowhere in logs or results


@pytest.fixture
def cluster():
    with ray_cluster(NODE, [NODE]) as cluster:
        yield cluster


@pytest.fixture
def traced_cluster(monkeypatch):
    """A cluster whose nodes and driver export traces to a receiver here: each from its own
    OTEL_* variables (as every node of a real cluster has its own), none sent with a job."""
    with receiving() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        with ray_cluster(NODE, [NODE]) as cluster:
            cluster.receiver = receiver
            yield cluster


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def script(csv_name: str, sleep_s: float = 0, fetch: str = "") -> list:
    """Count the rows of one CSV and hash the bytes the sandbox sees; answer with the count.
    `fetch`: a URL read first (through the --allow-net proxy)."""
    code = (
        f"import hashlib, os, time, pandas as pd\ntime.sleep({sleep_s})\n"
        + (
            f"import urllib.request\nurllib.request.urlopen({fetch!r}, timeout=30).read()\n"
            if fetch
            else ""
        )
        + f"df = pd.read_csv('/data/{csv_name}')\nos.makedirs('/workspace/output', exist_ok=True)\n"
        "open('/workspace/output/rows.txt', 'w').write(str(len(df)))\n"
        f"digest = hashlib.sha256(open('/data/{csv_name}', 'rb').read()).hexdigest()\n"
        "open('/workspace/output/sha256.txt', 'w').write(digest)\nprint(len(df))"
    )
    return [
        {
            "content": "Thought: count.",
            "tool_calls": [{"name": "python", "arguments": {"code": code}}],
        },
        {"content": f"Final Answer: {csv_name} has ROWS rows."},
    ]


def make_jobs(
    tmp_path,
    count: int,
    sleep_s: float = 0,
    endpoint: set[int] = frozenset(),
    fetch: dict | None = None,
):
    """`count` jobs over the real CSVs; those in `endpoint` ask the model endpoint instead of
    a script of their own; those in `fetch` ({job: URL}) read that URL first. Returns the jobs
    file and {id: (csv, rows)}."""
    lines, expected, server_script = [], {}, []
    for i in range(count):
        csv = CSVS[i % len(CSVS)]
        rows = len(pd.read_csv(csv))
        replies = script(csv.name, sleep_s, (fetch or {}).get(i, ""))
        replies[1]["content"] = replies[1]["content"].replace("ROWS", str(rows))
        job = {"id": f"job-{i:02d}", "task": f"Rows of {csv.name}?", "inputs": [str(csv)]}
        if i in endpoint:
            server_script += replies
        else:
            (tmp_path / f"script-{i}.json").write_text(json.dumps(replies))
            job["replay"] = f"script-{i}.json"
        lines.append(json.dumps(job))
        expected[job["id"]] = (csv, rows)
    jobs_file = tmp_path / "jobs.jsonl"
    jobs_file.write_text("\n".join(lines) + "\n")
    return jobs_file, expected, server_script


def batch_args(jobs_file, out, cluster, *more) -> list[str]:
    return ["batch", str(jobs_file), "--output", str(out), "--ray", cluster.address,
            "--no-progress", *more]  # fmt: skip


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def check_answered(record, out, expected):
    csv, rows = expected[record["id"]]
    assert record["status"] == "answered", record
    assert record["answer"].endswith(f"has {rows} rows."), record
    folder = out / record["id"]
    assert (folder / "output" / "rows.txt").is_file(), why_no_output(record, folder)
    assert (folder / "output" / "rows.txt").read_text() == str(rows)
    assert (folder / "output" / "sha256.txt").read_text() == sha256(csv)  # what the sandbox read
    assert (folder / "answer.md").exists() and (folder / "notebook.ipynb").exists()
    events = [json.loads(line) for line in (folder / "trace.jsonl").read_text().splitlines()]
    assert events[-1]["type"] == "final"
    (recorded,) = events[0]["inputs"]  # where the driver read it: `replay` finds it there
    assert recorded["path"] == str(csv.resolve()) and recorded["sha256"] == sha256(csv)


def why_no_output(record: dict, folder: Path) -> str:
    """What a job whose output is missing said: its warnings, its files, and what its cells
    observed (a cell that failed still lets the script's final answer through)."""
    trace = folder / "trace.jsonl"
    steps = read_trace(trace) if trace.exists() else []
    observed = [obs for e in steps for obs in e.get("observations") or []]
    return json.dumps(
        {"record": record, "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*")),
         "observations": observed}, indent=1, default=str,
    )[-6000:]  # fmt: skip


@pytest.mark.timeout(BATCH_S + 80)  # its waits in turn, and room
def test_twelve_jobs_on_two_nodes_all_answered_and_the_key_never_written(traced_cluster, tmp_path):
    """Two of them read a file over --allow-net: each through the proxy of its node, the
    connection back in its trace and audit. Each job is one trace: the driver's job span, the
    node's question under it (only the traceparent travelled)."""
    cluster = traced_cluster
    need_test_hosts()
    before = {p: (sha256(p), p.stat().st_mode) for p in CSVS}
    out = tmp_path / "out"
    with tcp_server(Files) as port:
        url = f"http://{FILES_HOST}:{port}/x.csv"
        jobs_file, expected, replies = make_jobs(tmp_path, 12, endpoint={5}, fetch={1: url, 2: url})
        allow = ("--allow-net", f"internal:{FILES_HOST}:{port}")
        with ScriptedServer(replies, api_key=KEY) as server:
            env = {**os.environ, "OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": server.url}
            run = sandcell(*batch_args(jobs_file, out, cluster, *allow), timeout=BATCH_S, env=env)
            assert run.returncode == 0, run.stderr[-3000:]
            assert server.served == 2  # job-05 went through the endpoint, with the key
    lines = records(out)
    assert sorted(r["id"] for r in lines) == sorted(expected)  # one line per job
    for record in lines:
        check_answered(record, out, expected)
    nodes = {n.node_id for n in cluster.list_all_nodes()}
    assert {r["node"] for r in lines} == nodes  # both nodes ran jobs
    assert {p: (sha256(p), p.stat().st_mode) for p in CSVS} == before  # inputs untouched
    assert "12 jobs: 12 answered" in run.stdout
    for job in ("job-01", "job-02"):
        (net,) = [e for e in read_trace(out / job / "trace.jsonl") if e["type"] == "net"]
        assert (net["host"], net["port"], net["allowed"]) == (FILES_HOST, port, True), net
        assert json.loads((out / job / "audit.json").read_text())["network"]["allowed"] == 1
    replay = sandcell("replay", str(out / "job-00" / "trace.jsonl"))
    assert replay.returncode == 0, replay.stdout + replay.stderr  # the same cells, the same output
    written = [out, cluster.head_node.get_session_dir_path()]
    leaks = subprocess.run(["grep", "-rl", KEY, *map(str, written)], capture_output=True, text=True)
    assert leaks.stdout == "" and KEY not in run.stdout + run.stderr
    check_job_traces(cluster.receiver, sorted(expected))


def check_job_traces(receiver, ids: list[str]) -> None:
    wait_for(lambda: len(receiver.named("invoke_agent")) >= len(ids), 30, "the nodes' spans")
    wait_for(lambda: len(receiver.named("sandcell batch job")) == len(ids), 30, "the job spans")
    spans = list(receiver.spans)
    roots = {s["attributes"]["sandcell.job.id"]: s for s in receiver.named("sandcell batch job")}
    assert sorted(roots) == ids
    for job_id, root in roots.items():
        assert root["parent"] == "" and root["attributes"]["sandcell.job.status"] == "answered"
        (agent,) = [s for s in spans if s["parent"] == root["span_id"]]
        assert (agent["name"], agent["trace_id"]) == ("invoke_agent sandcell", root["trace_id"])
        assert agent["attributes"]["gen_ai.conversation.id"] == job_id
        under = {s["name"] for s in spans if s["parent"] == agent["span_id"]}
        assert "execute_tool python" in under and any(n.startswith("chat ") for n in under)


def jobs_with_a_sandbox() -> list[Path]:
    """The nodes' scratch traces (run_here's folders) that say the job's sandbox is ready."""
    ready = []
    for trace in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*/out/*/trace.jsonl"):
        try:
            lines = trace.read_text().splitlines()
        except OSError:  # its job ended and the folder went between the glob and the read
            continue
        if any('"type": "sandbox"' in line for line in lines):
            ready.append(trace)
    return ready


@pytest.mark.timeout(120 + BATCH_S + 60 + 40)  # its waits in turn, and room
def test_a_node_removed_mid_job_its_job_is_answered_on_the_other(cluster, tmp_path):
    jobs_file, expected, _ = make_jobs(tmp_path, 3, sleep_s=6)
    out = tmp_path / "out"
    driver = sandcell_process(*batch_args(jobs_file, out, cluster))
    head, node = cluster.list_all_nodes()
    raylet = node.all_processes["raylet"][0].process.pid
    wait_for(lambda: job_task_workers(raylet), 120, "a job started on the second node")
    time.sleep(2)  # inside its 6-second cell
    cluster.remove_node(node, allow_graceful=False)
    stdout, stderr = driver.communicate(timeout=BATCH_S)
    assert driver.returncode == 0, stderr[-3000:]
    lines = records(out)
    assert sorted(r["id"] for r in lines) == sorted(expected)  # no duplicate line, none lost
    for record in lines:
        check_answered(record, out, expected)
        assert record["node"] == head.node_id  # the removed node's job was run again here
    sandcell("gc", check=True, timeout=60)


@pytest.mark.timeout(150 + BATCH_S + 60 + 40)  # its waits in turn, and room
def test_driver_killed_mid_batch_rerun_redoes_no_finished_job(cluster, tmp_path):
    jobs_file, expected, _ = make_jobs(tmp_path, 8, sleep_s=1)
    out = tmp_path / "out"
    first = sandcell_process(
        *batch_args(jobs_file, out, cluster), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    results = out / "results.jsonl"
    done_before = kill_after_results(first, results, 3, 150)
    assert 3 <= len(done_before) < 8
    second = sandcell(*batch_args(jobs_file, out, cluster), timeout=BATCH_S)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"skipped {len(done_before)} finished jobs" in second.stdout
    lines = results.read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == sorted(expected)
    for line in lines:
        record = json.loads(line)
        if record["id"] in done_before:
            assert line == done_before[record["id"]]  # not redone
        check_answered(record, out, expected)
    assert dead_scratch() == []  # the killed batch's job folders, removed by the next one
    sandcell("gc", check=True, timeout=60)


@pytest.mark.timeout(2 * BATCH_S + 40)  # its waits in turn, and room
def test_a_job_over_the_input_cap_fails_alone_and_shared_paths_runs_it(cluster, tmp_path):
    jobs_file, expected, _ = make_jobs(tmp_path, 4)
    big = tmp_path / "big.csv"
    big.write_text("n\n" + "\n".join(str(i) for i in range(400_000)) + "\n")  # about 2.7 MB
    (tmp_path / "script-big.json").write_text(
        json.dumps(script("big.csv")).replace("ROWS", "400000")
    )
    big_job = {"id": "big", "task": "Rows?", "inputs": [str(big)], "replay": "script-big.json"}
    with open(jobs_file, "a") as f:
        f.write(json.dumps(big_job) + "\n")
    expected["big"] = (big, 400_000)
    out = tmp_path / "out"
    run = sandcell(*batch_args(jobs_file, out, cluster, "--max-input-mb", "1"), timeout=BATCH_S)
    assert run.returncode == 1, run.stderr[-3000:]
    by_id = {r["id"]: r for r in records(out)}
    assert by_id["big"]["status"] == "failed"
    message = "its inputs are 2.6 MB, over the 1 MB a job may send through Ray's object store"
    assert message in by_id["big"]["error"] and message in run.stderr
    for job_id in expected.keys() - {"big"}:
        check_answered(by_id[job_id], out, expected)
    # the nodes read the file where it is (one machine: the same paths); the rerun runs it alone
    rerun = sandcell(
        *batch_args(jobs_file, out, cluster, "--max-input-mb", "1", "--shared-paths"),
        timeout=BATCH_S,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "skipped 4 finished jobs" in rerun.stdout
    lines = records(out)
    assert sorted(r["id"] for r in lines) == sorted(expected)
    check_answered(next(r for r in lines if r["id"] == "big"), out, expected)


@pytest.mark.timeout(BATCH_S + 40)
def test_a_library_is_copied_into_out_recipes_tried_on_the_nodes_and_learnt_on(cluster, tmp_path):
    family_of = delivery(tmp_path, {"A": 3, "E": 1})
    lib = tmp_path / "lib"
    lib.mkdir()
    a_file = next(name for name, family in family_of.items() if family == "A")
    layout = Layout.of([tmp_path / a_file])
    cleaning = FAMILIES["A"][2].replace("'{path}'", "INPUTS[0]") + SAVE
    library_recipe(lib, f"{layout.key}-1.py", layout, [cleaning])
    before = {p.name: p.read_bytes() for p in lib.iterdir()}
    model = FamilyModel(family_of)
    with ScriptedServer([model] * 4) as server:
        run = sandcell(
            *batch_args(tmp_path / "jobs.jsonl", tmp_path / "out", cluster, "--recipe", str(lib)),
            "--base-url", server.url, "--api-key", "k", "--model", "m", "--protocol", "tools",
            timeout=BATCH_S, cwd=tmp_path,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    solved = {r["id"]: r.get("solved_by") for r in records(tmp_path / "out")}
    assert sorted(solved.values()) == ["agent", "recipe", "recipe", "recipe"], solved
    assert model.asked == {"E": 2}  # only the family the library has no recipe for
    assert {p.name: p.read_bytes() for p in lib.iterdir()} == before  # DIR is never written
    # DIR copied into OUT/recipes/ and learnt on, as on one host: E's recipe beside A's
    (learnt,) = [r["recipe_learned"] for r in records(tmp_path / "out") if "recipe_learned" in r]
    own = sorted(p.name for p in (tmp_path / "out" / "recipes").glob("*.py"))
    assert own == sorted([f"{layout.key}-1.py", learnt.split("/")[-1]]), own


@pytest.mark.timeout(BATCH_S + 40)
def test_a_recipe_s_packages_come_from_each_node_s_wheelhouse(cluster, tmp_path, monkeypatch):
    # family A's recipe needs a package the wheelhouse has; family E's one it lacks: E's job
    # fails its recipe naming the node and the package, and the agent answers it
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the wheelhouse is made from a local wheel
    house = Wheelhouse(tmp_path / "wh")
    add(house, [], [], [make_wheel(tmp_path, "tinyclean")], "3.11")
    family_of = delivery(tmp_path, {"A": 2, "E": 1})
    lib = tmp_path / "lib"
    lib.mkdir()
    for family, needs in (("A", ["tinyclean"]), ("E", ["notthere"])):
        first = next(name for name, f in family_of.items() if f == family)
        layout = Layout.of([tmp_path / first])
        cleaning = FAMILIES[family][2].replace("'{path}'", "INPUTS[0]") + SAVE
        library_recipe(lib, f"{layout.key}-1.py", layout, [cleaning], packages=needs)
    model = FamilyModel(family_of)
    with ScriptedServer([model] * 2) as server:
        run = sandcell(
            *batch_args(tmp_path / "jobs.jsonl", tmp_path / "out", cluster, "--recipe", str(lib)),
            "--wheelhouse", str(house.path), "--base-url", server.url, "--api-key", "k",
            "--model", "m", "--protocol", "tools", timeout=BATCH_S, cwd=tmp_path,
        )  # fmt: skip
        told = [m["content"] for m in server.requests[0]["messages"] if m["role"] == "user"][0]
    assert run.returncode == 0, run.stderr[-3000:]
    lines = {r["id"]: r for r in records(tmp_path / "out")}
    by_family = {family_of[f"{i}.csv"]: r for i, r in lines.items()}
    assert [r["solved_by"] for i, r in lines.items() if family_of[f"{i}.csv"] == "A"] == [
        "recipe"
    ] * 2
    assert by_family["E"]["solved_by"] == "agent" and model.asked == {"E": 2}
    assert by_family["E"]["recipe_failure"] == {"cell": None, "error": "packages"}
    assert f"could not be installed on {socket.gethostname()}" in told and "notthere" in told


@pytest.mark.timeout(240)
def test_sigterm_stops_the_jobs_on_every_node_records_them_and_exits_143(cluster, tmp_path):
    jobs_file, expected, _ = make_jobs(tmp_path, 4, sleep_s=60)
    out = tmp_path / "out"
    earlier = set(jobs_with_a_sandbox())
    driver = sandcell_process(*batch_args(jobs_file, out, cluster))
    try:
        # a loaded machine may take a while from the task to its cell: each job's sandbox ready
        wait_for(lambda: len(set(jobs_with_a_sandbox()) - earlier) == 2, 120, "two jobs' cells")
        time.sleep(3)  # inside their 60-second cells
        stopped = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        stdout, stderr = driver.communicate(timeout=90)
    finally:
        driver.kill()  # a failed wait must not leave the batch running past the cluster
    assert driver.returncode == 143, stderr[-3000:]
    assert time.monotonic() - stopped < 45  # the cells were interrupted, not waited for
    lines = records(out)
    assert len(lines) == 2 and {r["status"] for r in lines} == {"interrupted"}, lines
    assert {r["stop_reason"] for r in lines} == {"terminated"}
    for record in lines:
        assert (out / record["id"] / "trace.jsonl").exists()  # what was done is kept


def test_ray_flags_misused_or_no_cluster_are_one_line_errors(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "task": "x"}\n')
    base = ["batch", str(jobs), "--output", str(tmp_path / "o")]
    env = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    for more, status, message in (
        (["--ray", "--workers", "3"], 2, "Error: --workers is for a batch on this host"),
        (["--shared-paths"], 2, "Error: --shared-paths goes with --ray"),
        (["--max-input-mb", "5"], 2, "Error: --max-input-mb goes with --ray"),
        (["--ray", "127.0.0.1:1"], 3, "sandcell: no Ray cluster answers at 127.0.0.1:1"),
    ):
        run = sandcell(*base, *more, timeout=60, env=env)
        assert run.returncode == status and message in run.stderr, (more, run.stderr)
        assert "Traceback" not in run.stderr


def test_a_dead_jobs_scratch_folder_is_removed_and_a_running_ones_kept():
    dead = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))  # as a killed worker leaves it
    (dead / SCRATCH_LOCK).touch()
    (dead / "inputs").mkdir()
    with scratch_folder() as running:
        remove_dead_scratch()  # (the lock is per open file: this same process is refused too)
        assert running.is_dir() and not dead.exists()
    assert not running.exists()
