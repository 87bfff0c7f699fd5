"""The recipe library on a Ray cluster (issue 48): the driver learns, one agent run per layout
across every node. A real cluster on this machine shared by the module's tests (a head that
offers no sandbox and two nodes of 2 `sandcell` slots each), the real CLI, real sandboxes, a
scripted model server that answers each job as its family needs (tests/deliveries.py, as
the local library tests use)."""

import json
import signal
from collections import Counter

import pytest

from tests.cli_runner import sandcell, sandcell_process
from tests.deliveries import FamilyModel, delivery
from tests.missing import IN_CI
from tests.polling import wait_for
from tests.scripted_server import ScriptedServer

try:
    from tests.ray_cluster import job_task_workers, owned_by, ray_cluster  # imports Ray
except ImportError:  # `make test` installs it; with CI=true a missing Ray is a failure
    if IN_CI:
        raise
    pytest.skip("ray is not installed: pip install -e '.[ray]'", allow_module_level=True)

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("ray")]  # one cluster at a time
NODE = {"num_cpus": 1, "resources": {"sandcell": 2}, "object_store_memory": 100 << 20}
BATCH_S = 420  # eleven jobs on a loaded 2-core machine, four sandboxes at once


@pytest.fixture(scope="module")
def cluster():
    # a head that offers no sandbox (any node may be removed), two nodes of 2 slots each
    head = {"num_cpus": 1, "object_store_memory": 100 << 20}
    with ray_cluster(head, [NODE, NODE]) as cluster:
        yield cluster


def batch_args(folder, out: str, cluster, server, recipe: str) -> list[str]:
    return ["batch", str(folder / "jobs.jsonl"), "--output", str(folder / out), "--ray",
            cluster.address, "--no-progress", "--recipe", recipe, "--base-url", server.url,
            "--api-key", "k", "--model", "m", "--protocol", "tools"]  # fmt: skip


def results(out) -> dict[str, dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


def ray_batch(folder, out: str, cluster, recipe: str, model: FamilyModel):
    with ScriptedServer([model] * 60) as server:
        done = sandcell(
            *batch_args(folder, out, cluster, server, recipe), timeout=BATCH_S, cwd=folder
        )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return results(folder / out), done


@pytest.mark.timeout(2 * BATCH_S + 60)
def test_one_agent_run_per_family_across_the_nodes_then_a_later_delivery_asks_for_the_new(
    cluster, tmp_path
):
    # the local library test's delivery: eleven shuffled files of four families, C and D
    # sharing a layout (tests/test_recipe_library.py)
    family_of = delivery(tmp_path, {"A": 3, "B": 2, "C": 3, "D": 3})
    model = FamilyModel(family_of)
    got, done = ray_batch(tmp_path, "out", cluster, "auto", model)
    assert all(r["status"] == "answered" and r["checks"]["passed"] for r in got.values()), got
    # one agent run (two requests: the cell, the answer) per family: the local test's counts
    assert model.asked == {"A": 2, "B": 2, "C": 2, "D": 2}, model.asked
    assert Counter(r["solved_by"] for r in got.values()) == {"agent": 4, "recipe": 7}, got
    assert {r["node"] for r in got.values()} == {n.node_id for n in cluster.worker_nodes}
    for r in got.values():
        assert r["solved_by"] == "agent" or r["recipe"] == r["recipes_tried"][-1]
        assert len(r["recipes_tried"]) <= 3 and "_recipe_failures" not in r
    keys = {family_of[f"{j}.csv"]: r["layout"] for j, r in got.items()}
    assert keys["C"] == keys["D"] and len(set(keys.values())) == 3
    library = sorted((tmp_path / "out" / "recipes").glob("*.py"))
    assert len(library) == 4, library
    learnt = sorted(r["recipe_learned"] for r in got.values() if r.get("recipe_learned"))
    assert learnt == [f"recipes/{p.name}" for p in library]  # each from one agent run
    for path in library:
        checked = sandcell("recipe", "--check", str(path))
        assert checked.returncode == 0, checked.stderr
    drifts = [r["drift"] for r in got.values() if r.get("drift")]
    assert len(drifts) == 1 and drifts[0].startswith(
        f"new recipe for a known layout: {keys['C']}-1.py failed its checks"
    ), drifts
    assert "recipes: 7 jobs solved by a recipe, 4 by the agent; 4 recipes learnt" in done.stdout
    solved = next(r for r in got.values() if r["solved_by"] == "recipe")  # as a local job says
    assert f"[{solved['recipe']}](../recipes/{solved['recipe']})" in solved["answer"]
    listed = sandcell("recipe", "--list", str(tmp_path / "out" / "recipes"))
    assert listed.returncode == 0 and "solved 0 jobs" not in listed.stdout, listed.stdout

    # next month's delivery into its own output, with the library given: only E is asked for
    later = tmp_path / "later"
    later.mkdir()
    family_of = delivery(later, {"A": 2, "B": 1, "C": 1, "D": 1, "E": 2}, start=50)
    model = FamilyModel(family_of)
    got, _ = ray_batch(later, "out2", cluster, str(tmp_path / "out" / "recipes"), model)
    assert model.asked == {"E": 2}, model.asked
    assert all(r["status"] == "answered" for r in got.values()), got
    assert len(list((later / "out2" / "recipes").glob("*.py"))) == 5


def running_node(cluster):
    """The worker node whose raylet runs a job now (None while none does)."""
    for node in cluster.worker_nodes:
        if job_task_workers(node.all_processes["raylet"][0].process.pid):
            return node
    return None


@pytest.mark.timeout(BATCH_S + 180)
def test_a_node_lost_during_a_learning_run_its_layout_still_learns_once(cluster, tmp_path):
    family_of = delivery(tmp_path, {"A": 3})
    model = FamilyModel(family_of, delay=8.0)  # the learning run is slow: the node goes in it
    with ScriptedServer([model] * 20) as server:
        driver = sandcell_process(*batch_args(tmp_path, "out", cluster, server, "auto"))
        try:
            wait_for(lambda: model.asked["A"] >= 1, 180, "the learning run's first request")
            node = running_node(cluster)
            assert node is not None, "the learning run is on no worker node"
            # the other two jobs wait on the driver: one task in the whole cluster
            assert sum(
                len(job_task_workers(n.all_processes["raylet"][0].process.pid))
                for n in cluster.worker_nodes
            ) == 1  # fmt: skip
            cluster.remove_node(node, allow_graceful=False)
            stdout, stderr = driver.communicate(timeout=BATCH_S)
        finally:
            driver.kill()
            cluster.add_node(**NODE)  # the next test has two nodes again
            cluster.wait_for_nodes(timeout=60)
    assert driver.returncode == 0, stderr[-3000:]
    got = results(tmp_path / "out")
    assert all(r["status"] == "answered" for r in got.values()), got
    (learner,) = [r for r in got.values() if r["solved_by"] == "agent"]
    assert sorted(r["solved_by"] for r in got.values()) == ["agent", "recipe", "recipe"]
    assert len(list((tmp_path / "out" / "recipes").glob("*.py"))) == 1
    # the lost run's requests and the one that finished: the second run is said
    assert model.asked["A"] in (3, 4), model.asked
    assert any("its Ray worker or node was lost mid-job" in w for w in learner["warnings"])
    sandcell("gc", check=True, timeout=60)


@pytest.mark.timeout(BATCH_S + 240)
def test_sigterm_mid_learning_exits_143_leaves_no_container_and_the_rerun_learns_once(
    cluster, tmp_path
):
    family_of = delivery(tmp_path, {"A": 3, "B": 3})
    model = FamilyModel(family_of, delay=6.0)
    with ScriptedServer([model] * 40) as server:
        args = batch_args(tmp_path, "out", cluster, server, "auto")
        driver = sandcell_process(*args)
        try:
            both = lambda: model.asked["A"] >= 1 and model.asked["B"] >= 1  # noqa: E731
            wait_for(both, 180, "both learning runs asking")
            driver.send_signal(signal.SIGTERM)
            stdout, stderr = driver.communicate(timeout=120)
        finally:
            driver.kill()
        assert driver.returncode == 143, stderr[-3000:]
        wait_for(lambda: not owned_by(cluster.processes.seen), 30, "the nodes' sandboxes gone")
        stopped = results(tmp_path / "out") if (tmp_path / "out" / "results.jsonl").exists() else {}
        # the learning runs were stopped in their model call: recorded as terminated
        assert {r["status"] for r in stopped.values()} <= {"interrupted", "answered"}, stopped
        asked_before = Counter(model.asked)
        rerun = sandcell(*args, timeout=BATCH_S, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    got = results(tmp_path / "out")
    assert len(got) == 6 and all(r["status"] == "answered" for r in got.values()), got
    # one recipe per layout over both runs: nothing learnt twice
    library = sorted(p.name for p in (tmp_path / "out" / "recipes").glob("*.py"))
    assert len(library) == 2, library
    keys = {r["layout"] for r in got.values()}
    assert sorted(name.split("-")[0] for name in library) == sorted(keys)
    # the rerun asks at most one agent run per layout not learnt before the stop
    assert all(model.asked[f] - asked_before[f] in (0, 2) for f in "AB"), model.asked
