"""`sandcell serve --ray` (issue 49, first step): each session's sandbox on a node of a real Ray
cluster on this machine (a head that offers no sandbox, two nodes of 2 `sandcell` slots,
shared by the module), the real CLI in its own process with scripted replies, over HTTP.
Sessions land on both nodes; a cell's lines stream as they are printed; an interrupt reaches
a cell on a node and the kernel keeps its variables; inputs go out and files come back; a
full cluster answers 503; the server's stop removes every container on every node."""

import json
import os
import signal
import threading
import time

import anyio
import psutil
import pytest

from sandcell.sandbox import Execution
from tests.cli_runner import sandcell
from tests.containers import container_labels, owner_label
from tests.loopback import FETCH, FILES_HOST, Files, need_test_hosts, tcp_server
from tests.mcp_helpers import http_session, start_http, text
from tests.mcp_helpers import python as python_mcp
from tests.missing import IN_CI
from tests.polling import wait_for
from tests.scripted_server import ScriptedServer
from tests.serve_helpers import (
    ALICE,
    BOB,
    SALES,
    ask,
    client,
    events,
    execute,
    new_session,
    python,
    serve_process,
    upload,
)

try:
    from tests.ray_cluster import owned_by, ray_cluster  # imports Ray
except ImportError:  # `make test` installs it; with CI=true a missing Ray is a failure
    if IN_CI:
        raise
    pytest.skip("ray is not installed: pip install -e '.[ray]'", allow_module_level=True)

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("ray")]  # one cluster at a time
NODE = {"num_cpus": 1, "resources": {"sandcell": 2}, "object_store_memory": 100 << 20}
LINES = (
    "import time\nfor i in range(4):\n    print('line', i, flush=True)\n    time.sleep(1)\n"
    "open('/workspace/made.txt', 'w').write('made on a node')"
)


@pytest.fixture(scope="module")
def cluster():
    head = {"num_cpus": 1, "object_store_memory": 100 << 20}  # offers no sandbox
    with ray_cluster(head, [NODE, NODE]) as cluster:
        yield cluster


def value(response) -> str:
    assert response.status_code == 200, response.text
    ex = Execution.from_dict(response.json())
    assert ex.ok, ex
    return ex.text


@pytest.fixture
def two_servers():
    """Two HTTP servers on loopback, for --allow-net: their ports."""
    need_test_hosts()
    with tcp_server(Files) as first, tcp_server(Files) as second:
        yield first, second


@pytest.mark.timeout(420)
def test_sessions_on_both_nodes_stream_interrupt_files_and_a_full_cluster(
    cluster, tmp_path, two_servers
):
    """... and --allow-net narrowed by alice's line holds on the nodes' proxies."""
    replies = [python(LINES), "Final Answer: made it."]
    a, b = (f"internal:{FILES_HOST}:{port}" for port in two_servers)
    proc, base = serve_process(
        tmp_path, replies, "--ray", cluster.address, "--pool", "0", "--allow-net", f"{a},{b}",
        users={"alice": f"{ALICE} allow-net={a}"},
    )  # fmt: skip
    try:
        with client(base) as api, client(base) as other:
            sids = [new_session(api) for _ in range(4)]
            assert upload(api, sids[0], ("sales.csv", SALES.read_bytes())).status_code == 201
            for number, sid in enumerate(sids):
                assert value(execute(api, sid, f"x = {number}; x")) == str(number)
            nodes = [api.get(f"/api/sessions/{sid}").json()["node"] for sid in sids]
            assert set(nodes) == {n.node_id for n in cluster.worker_nodes}, nodes
            # every slot is taken: the fifth session waits for one
            full = api.post("/api/sessions")
            assert full.status_code == 503 and "slot of the Ray cluster" in full.json()["error"]
            assert int(full.headers["retry-after"]) >= 1
            # /metrics counts nodes and slots (no node is a label), and the refusal
            scraped = api.get("/metrics").text
            for line in (
                "sandcell_nodes 2.0", 'sandcell_slots{state="used"} 4.0',
                'sandcell_slots{state="free"} 0.0', 'sandcell_rejections_total{reason="capacity"} 1.0',
            ):  # fmt: skip
                assert line in scraped.splitlines(), scraped
            # the uploaded file went to its node
            read = execute(api, sids[0], "import pandas as pd; len(pd.read_csv('/data/sales.csv'))")
            assert value(read) == "12"

            # a line a second: the first is on the stream long before the cell ends
            with api.stream(
                "POST", f"/api/sessions/{sids[1]}/messages", json={"content": "go"}
            ) as r:
                arrived = {}
                for kind, data in events(r):
                    if kind == "output" and "first" not in arrived:
                        arrived["first"] = time.monotonic()
                        assert data["text"].startswith("line 0")
                    if kind == "observation":
                        arrived["end"] = time.monotonic()
            assert arrived["end"] - arrived["first"] > 2.0, arrived
            made = api.get(f"/api/sessions/{sids[1]}/files/workspace/made.txt")
            assert made.status_code == 200 and made.text == "made on a node"  # came back

            # an interrupt reaches a cell on its node; the kernel keeps its variables
            ran: dict = {}
            spin = threading.Thread(
                target=lambda: ran.update(r=execute(other, sids[2], "while True: pass"))
            )
            spin.start()
            wait_for(lambda: api.get(f"/api/sessions/{sids[2]}").json()["running"], 30)
            time.sleep(1)
            assert api.post(f"/api/sessions/{sids[2]}/interrupt").json() == {"interrupted": True}
            spin.join(30)
            stopped = Execution.from_dict(ran["r"].json())
            assert stopped.error is not None and stopped.error.name == "KeyboardInterrupt"
            assert value(execute(api, sids[2], "x")) == "2"

            # alice's sandbox reaches the one host of her line, on its node's proxy
            fetched = [
                execute(api, sids[3], FETCH.format(host=FILES_HOST, port=port)).json()
                for port in two_servers
            ]
            said = ["".join(s["text"] for s in ran["stream"]) for ran in fetched]
            assert said == [
                "fetched\n",
                f"HTTP Error 403: not allowed: {FILES_HOST}:{two_servers[1]}; this sandbox may "
                f"reach: {a}\n",
            ], said
            assert [(n["host"], n["allowed"]) for f in fetched for n in f["net"]] == [
                (FILES_HOST, True), (FILES_HOST, False)
            ]  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert proc.returncode in (0, 143), proc.returncode
    # the stop removed every sandbox on every node
    wait_for(lambda: not owned_by(cluster.processes.seen), 30, "the nodes' sandboxes gone")


def test_serve_ray_with_no_cluster_is_a_one_line_error(tmp_path):
    env = {**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    run = sandcell(
        "serve", "--ray", "127.0.0.1:1", "--data", str(tmp_path / "d"), timeout=60, env=env
    )
    assert run.returncode == 3, run.stderr
    assert "no Ray cluster answers at 127.0.0.1:1" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.timeout(420)
def test_a_node_lost_under_a_live_session_its_next_cell_runs_on_another_after_a_replay(
    cluster, tmp_path
):
    replies = [
        python("x = 41\nopen('/workspace/kept.txt', 'w').write('kept')"),
        "Final Answer: set.",
    ]
    proc, base = serve_process(tmp_path, replies, "--ray", cluster.address, "--pool", "0")
    try:
        with client(base) as api:
            sid = new_session(api)
            assert ask(api, sid, "set x")[-1][1]["answer"] == "set."
            lost = api.get(f"/api/sessions/{sid}").json()["node"]
            removed_with_its_workers(cluster, lost)
            r = execute(api, sid, "x + 1")
            assert value(r) == "42"  # the kernel rebuilt by replay, on the other node
            warning = r.headers["x-sandcell-warning"]
            assert lost in warning and "re-running its 1 recorded cell" in warning, warning
            now = api.get(f"/api/sessions/{sid}").json()["node"]
            assert now != lost and now in {n.node_id for n in cluster.worker_nodes}
            kept = api.get(f"/api/sessions/{sid}/files/workspace/kept.txt")
            assert kept.status_code == 200 and kept.text == "kept"
            trace = [json.loads(line) for line in api.get(f"/api/sessions/{sid}/trace").text.splitlines()]  # fmt: skip
            assert {"node_lost"} <= {e.get("reason") for e in trace if e["type"] == "rebuilt"}
            assert [e["node"] for e in trace if e["type"] == "sandbox_released"] == [lost]
    finally:
        stopped_with_a_node_back(proc, cluster)
    # the lost node's container too: removed by the node that shares its engine
    wait_for(lambda: not owned_by(cluster.processes.seen), 60, "every sandbox gone")


def stopped_with_a_node_back(proc, cluster) -> None:
    """The server stopped (SIGTERM) and a node added for the one the test removed: the next
    test has two again."""
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    cluster.add_node(**NODE)
    cluster.wait_for_nodes(timeout=60)


def removed_with_its_workers(cluster, node_id: str) -> None:
    """The worker node `node_id` removed (its raylet killed), once its workers are gone too
    (a worker outlives its killed raylet a little here; on a lost host all goes at once)."""
    (node,) = [n for n in cluster.worker_nodes if n.node_id == node_id]
    workers = psutil.Process(node.all_processes["raylet"][0].process.pid).children(recursive=True)
    cluster.remove_node(node, allow_graceful=False)
    wait_for(lambda: not any(w.is_running() for w in workers), 60, "the node's workers gone")


@pytest.mark.timeout(420)
def test_under_gvisor_a_session_paused_on_one_node_resumes_on_another(cluster, tmp_path):
    proc, base = serve_process(
        tmp_path, ["Final Answer: unused."], "--ray", cluster.address, "--pool", "0", "--runtime", "runsc",
        "--idle-minutes", "0.05",  # 3 s
    )  # fmt: skip
    try:
        with client(base) as api:
            sid = new_session(api)
            x = value(execute(api, sid, "import random\nx = random.random()\nx"))
            first = api.get(f"/api/sessions/{sid}").json()["node"]
            paused = lambda: api.get(f"/api/sessions/{sid}").json()["sandbox"] == "paused"  # noqa: E731
            wait_for(paused, 120, "the idle pause")
            assert api.get(f"/api/sessions/{sid}").json()["node"] is None
            folder = tmp_path / "d" / "alice" / sid / ".paused"
            assert folder.is_dir() and oct(folder.stat().st_mode & 0o777) == "0o700"
            removed_with_its_workers(cluster, first)  # the pause belongs to no node
            r = execute(api, sid, "x")
            said = [line for line in api.get(f"/api/sessions/{sid}/trace").text.splitlines()
                    if "sandbox_resumed" in line]  # fmt: skip
            assert r.json().get("error") is None, (r.headers.get("x-sandcell-warning"), said)
            assert value(r) == x and "x-sandcell-warning" not in r.headers  # the same kernel
            now = api.get(f"/api/sessions/{sid}").json()["node"]
            assert now != first and now in {n.node_id for n in cluster.worker_nodes}
            trace = [json.loads(line) for line in api.get(f"/api/sessions/{sid}/trace").text.splitlines()]  # fmt: skip
            kinds = [e["type"] for e in trace]
            assert "sandbox_paused" in kinds and "rebuilt" not in kinds, kinds
            (resumed,) = [e for e in trace if e["type"] == "sandbox_resumed"]
            assert resumed.get("error") is None and resumed["node"] == now, resumed
            (pause,) = [e for e in trace if e["type"] == "sandbox_paused"]
            assert pause["node"] == first
    finally:
        stopped_with_a_node_back(proc, cluster)
    wait_for(lambda: not owned_by(cluster.processes.seen), 60, "every sandbox gone")


@pytest.mark.timeout(420)
def test_sigterm_pauses_the_sessions_on_both_nodes_and_a_restart_restores_them(cluster, tmp_path):
    options = ["--ray", cluster.address, "--pool", "0", "--runtime", "runsc", "--stop-grace", "60"]
    proc, base = serve_process(tmp_path, ["Final Answer: unused."], *options)
    values = {}
    try:
        with client(base) as api:
            sids = [new_session(api) for _ in range(3)]
            for sid in sids:
                values[sid] = value(execute(api, sid, "import random\nx = random.random()\nx"))
            nodes = {api.get(f"/api/sessions/{sid}").json()["node"] for sid in sids}
            assert nodes == {n.node_id for n in cluster.worker_nodes}  # both nodes hold some
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    wait_for(lambda: not owned_by(cluster.processes.seen), 60, "every sandbox gone")
    for sid in sids:  # each kernel paused into its folder, on the server
        assert (tmp_path / "d" / "alice" / sid / ".paused" / "pause.hmac").is_file()
    proc, base = serve_process(tmp_path, ["Final Answer: unused."], *options)
    try:
        with client(base) as api:
            listed = {s["id"]: s["sandbox"] for s in api.get("/api/sessions").json()}
            assert listed == dict.fromkeys(sids, "paused"), listed
            for sid in sids:
                r = execute(api, sid, "x")
                assert value(r) == values[sid] and "x-sandcell-warning" not in r.headers
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=180)
    wait_for(lambda: not owned_by(cluster.processes.seen), 60, "every sandbox gone")


@pytest.mark.timeout(300)
def test_mcp_http_ray_opens_each_session_s_sandbox_on_a_node_and_a_lost_node_says_so(
    cluster, tmp_path
):
    data = tmp_path / "sales.csv"
    data.write_text("region,amount\nnorth,10\n")
    lost = next(iter(cluster.worker_nodes)).node_id  # holds one of the two sessions' sandboxes
    owners: set[str] = set()
    proc, url = start_http(tmp_path, "--ray", cluster.address, "--pool", "0", "--input", str(data))

    async def two_sessions():
        async with http_session(url, ALICE) as (alice, _), http_session(url, BOB) as (bob, _):
            read = "open('/data/sales.csv').read().splitlines()[1]"
            for number, session in enumerate((alice, bob)):
                assert text(await python_mcp(session, f"x = {number}; {read}")) == "'north,10'"
            # each on a node's actor (most free slots first: one a node), none on the server
            owners.update(c["sandcell.owner"] for c in owned_by(cluster.processes.seen))
            assert container_labels(owner_label(proc.pid)) == []
            removed_with_its_workers(cluster, lost)
            after = [await python_mcp(session, "x") for session in (alice, bob)]
            errors = [text(r) for r in after if r.isError]
            assert len(errors) == 1 and f"the Ray node {lost}" in errors[0], errors
            assert [text(r) for r in after if not r.isError] in (["0"], ["1"])

    try:
        anyio.run(two_sessions)
        assert len(owners) == 2, owners
    finally:
        stopped_with_a_node_back(proc, cluster)
    wait_for(lambda: not owned_by(cluster.processes.seen), 60, "every sandbox gone")


@pytest.mark.timeout(240)
def test_doctor_ray_checks_each_node_s_engine_image_and_runtimes(cluster):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SANDCELL_M"))}
    with ScriptedServer(model="scripted-model") as server:
        env |= {"OPENAI_BASE_URL": server.url, "SANDCELL_MODEL": "scripted-model"}
        done = sandcell(
            "doctor", "--ray", cluster.address, "--runtime", "runsc", env=env, timeout=180
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "ok  cluster   2 of 3 node(s)" in done.stdout and "offer 4 sandbox slot(s)" in done.stdout
    )
    for node in cluster.worker_nodes:
        mine = [line for line in done.stdout.splitlines() if f"node {node.node_id[:12]}" in line]
        assert [line.split()[:2] for line in mine] == [
            ["ok", "engine"], ["ok", "image"], ["ok", "runtime"]
        ], done.stdout  # fmt: skip
    missing = sandcell("doctor", "--ray", "127.0.0.1:1", env=env, timeout=60)
    assert missing.returncode == 3 and "FAIL  cluster   no Ray cluster answers" in missing.stdout
