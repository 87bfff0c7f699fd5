"""The Ray driver's layout learning without a cluster (agent/jobs/ray_learning.py): what it
sends, what waits on it holding nothing, what it answers a node job, and what it does with a
job that comes back. The cluster itself: tests/test_ray_library.py."""

import pytest

from sandcell.agent.jobs.batch import NODE_FAILURES, Job, load_jobs
from sandcell.agent.jobs.fingerprint import Layout
from sandcell.agent.jobs.recipe_library import FOLDER, Entry, Library
from sandcell.agent.jobs.recipe_maker import load
from tests.deliveries import FAMILIES, SAVE, delivery, library_recipe

try:
    from sandcell.agent.jobs.ray_learning import Claim, ClusterLearning, Start, Starting
except ImportError:  # Ray is not installed (the module imports it)
    pytest.skip("ray is not installed: pip install -e '.[ray]'", allow_module_level=True)

pytestmark = pytest.mark.timeout(60)


def jobs_of(tmp_path, counts: dict[str, int]) -> list[Job]:
    delivery(tmp_path, counts)
    return load_jobs(tmp_path / "jobs.jsonl")


def agent_record(job: Job, tried: list[str]) -> dict:
    return {"id": job.id, "status": "answered", "solved_by": "agent", "recipes_tried": tried,
            "checks": {"passed": True}, "warnings": []}  # fmt: skip


def test_the_first_job_of_a_new_layout_learns_and_the_others_wait_holding_nothing(tmp_path):
    jobs = jobs_of(tmp_path, {"A": 3})
    requeued: list[Job] = []
    learning = ClusterLearning(Library(tmp_path / "out" / FOLDER, []), requeued.extend)
    first, second, third = jobs
    carried = learning.place(first)
    assert carried is not None and carried.recipes.entries == []  # it claimed the agent run
    assert learning.place(second) is None and learning.place(third) is None  # no task
    key = carried.layout.key
    # its node asks as it starts (a retry after a lost node asks again): never told to wait
    for _ in range(2):
        assert learning.answer(Starting(first.id, key, ())) == Start(False, 0, None)
    assert learning.answer(Claim(first.id, key, 0)) is True
    # it comes back with no trace in its folder: nothing learnt, said; the next job learns
    folder = tmp_path / "out" / first.id
    folder.mkdir(parents=True)
    record = agent_record(first, []) | {NODE_FAILURES: {}}
    learning.ended(first, record, folder)
    assert NODE_FAILURES not in record and "recipe_learned" not in record
    assert any("no recipe learnt from this job" in w and "trace.jsonl" in w
               for w in record["warnings"])  # fmt: skip
    assert any("ran 2 times" in w for w in record["warnings"])  # the retry is said
    assert requeued == [second, third]
    assert learning.place(second) is not None and learning.place(third) is None


def test_a_job_sent_with_recipes_gets_newer_ones_as_it_starts_and_claims_on_drift(tmp_path):
    jobs = jobs_of(tmp_path, {"A": 3})
    library_folder = tmp_path / "out" / FOLDER
    library_folder.mkdir(parents=True)
    layout = Layout.of([tmp_path / f"{jobs[0].id}.csv"])
    cleaning = FAMILIES["A"][2].replace("'{path}'", "INPUTS[0]") + SAVE
    library_recipe(library_folder, f"{layout.key}-1.py", layout, [cleaning])
    library = Library.load(library_folder)
    requeued: list[Job] = []
    learning = ClusterLearning(library, requeued.extend)
    a, b, c = (learning.place(job) for job in jobs)  # each goes, with the recipe's text
    carried = (f"{layout.key}-1.py",)
    assert a and b and c and tuple(e.name for e in a.recipes.entries) == carried
    # named as OUT/<id>/ sees it, whatever the node's folders
    assert a.recipes.entries[0].path.as_posix() == f"../{FOLDER}/{layout.key}-1.py"
    assert "INPUTS[0]" in "\n".join(a.recipes.entries[0].recipe.cells)
    # the recipe failed job 0's checks: it claims; job 1's claim then waits (parked)
    assert learning.answer(Claim(jobs[0].id, layout.key, 0)) is True
    assert learning.answer(Claim(jobs[1].id, layout.key, 0)) is False
    # job 2 starts on its node while the layout is learned: told to wait
    assert learning.answer(Starting(jobs[2].id, layout.key, carried)).parked
    learning.parked(jobs[1])
    learning.parked(jobs[2])
    # job 0's run learnt the layout (the cluster test makes the recipe from a real trace)
    library_recipe(library_folder, f"{layout.key}-2.py", layout, [cleaning])
    library.entries.append(Entry(library_folder / f"{layout.key}-2.py",
                                 load(library_folder / f"{layout.key}-2.py"), rank=9))  # fmt: skip
    learning.learning.ended(jobs[0].id, learned=True)
    assert requeued == [jobs[1], jobs[2]]
    # sent again, they carry both recipes, the newest first; one sent before gets them as it
    # starts, and a job that carries them gets nothing more
    again = learning.place(jobs[1])
    newest = (f"{layout.key}-2.py", f"{layout.key}-1.py")
    assert again is not None and tuple(e.name for e in again.recipes.entries) == newest
    start = learning.answer(Starting(jobs[2].id, layout.key, carried))
    assert isinstance(start, Start) and not start.parked and start.learned == 1
    assert start.recipes is not None and tuple(e.name for e in start.recipes.entries) == newest
    assert learning.answer(Starting(jobs[1].id, layout.key, newest)).recipes is None


def test_a_job_told_to_wait_whose_node_died_waits_once(tmp_path):
    jobs = jobs_of(tmp_path, {"A": 2})
    library_folder = tmp_path / "out" / FOLDER
    library_folder.mkdir(parents=True)
    layout = Layout.of([tmp_path / f"{jobs[0].id}.csv"])
    library_recipe(library_folder, f"{layout.key}-1.py", layout, ["df = 1"])
    requeued: list[Job] = []
    learning = ClusterLearning(Library.load(library_folder), requeued.extend)
    first, second = jobs
    assert learning.place(first) and learning.place(second)
    assert learning.answer(Claim(first.id, layout.key, 0)) is True  # its recipe failed
    carried = (f"{layout.key}-1.py",)
    assert learning.answer(Starting(second.id, layout.key, carried)).parked
    # its node died before it came back parked: Ray runs it again, and it is told again
    assert learning.answer(Starting(second.id, layout.key, carried)).parked
    learning.parked(second)
    learning.lost(first)  # the learning run failed outright: the waiting job goes, once
    assert requeued == [second]
