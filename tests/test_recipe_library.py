"""A recipe library across deliveries (issue 38), end to end: real CLI, real sandboxes, a
scripted model server that answers each job as its family needs. A shuffled folder of four
families under names that do not say which, two of them sharing one layout (each one's
recipe runs on the other's files but fails their checks); one agent run per family; the
library's files; waiting for a layout being learned; a clean slate between attempts;
`--recipe DIR` on a later delivery; the usage errors; `recipe --list`."""

import hashlib
import json
from collections import Counter

import pytest

from sandcell.agent.events import ATTEMPT, Reset
from sandcell.agent.jobs.fingerprint import Layout
from sandcell.agent.records.trace import read_events
from tests.cli_runner import sandcell
from tests.deliveries import FAMILIES, SAVE, FamilyModel, delivery, library_recipe
from tests.scripted_server import ScriptedServer

pytestmark = pytest.mark.docker


def batch(folder, out: str, recipe: str, model: FamilyModel, workers: int = 2, replies=60):
    with ScriptedServer([model] * replies) as server:
        done = sandcell(
            "batch", "jobs.jsonl", "--output", out, "--workers", str(workers), "--no-progress",
            "--recipe", recipe, "--base-url", server.url, "--api-key", "k", "--model", "m",
            "--protocol", "tools", cwd=folder, timeout=500,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (folder / out / "results.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}, done


def digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.timeout(900)
def test_one_agent_run_per_family_then_recipes_and_a_later_delivery_asks_nothing(tmp_path):
    family_of = delivery(tmp_path, {"A": 3, "B": 2, "C": 3, "D": 3})
    model = FamilyModel(family_of)
    got, done = batch(tmp_path, "out", "auto", model)
    assert all(r["status"] == "answered" and r["checks"]["passed"] for r in got.values()), got
    # one agent run (two requests: the cell, the answer) per family, C and D sharing a layout
    assert model.asked == {"A": 2, "B": 2, "C": 2, "D": 2}, model.asked
    by = Counter(r["solved_by"] for r in got.values())
    assert by == {"agent": 4, "recipe": 7}, got
    for r in got.values():
        assert r["solved_by"] == "agent" or r["recipe"] == r["recipes_tried"][-1]
        assert len(r["recipes_tried"]) <= 3
    keys = {family_of[f"{j}.csv"]: r["layout"] for j, r in got.items()}
    assert keys["C"] == keys["D"] and len(set(keys.values())) == 3

    # the library: one recipe per family, each a recipe that `recipe --check` accepts
    library = sorted((tmp_path / "out" / "recipes").iterdir())
    assert len(library) == 4 and all(p.name.endswith(".py") for p in library), library
    for path in library:
        checked = sandcell("recipe", "--check", str(path))
        assert checked.returncode == 0, checked.stderr
    assert sum(p.name.startswith(keys["C"]) for p in library) == 2
    # the second family of the shared layout drifted: said in the results, summary, report
    drifts = [r for r in got.values() if r.get("drift")]
    assert len(drifts) == 1 and family_of[f"{drifts[0]['id']}.csv"] in "CD", drifts
    said = drifts[0]["drift"]
    assert said.startswith(f"new recipe for a known layout: {keys['C']}-1.py failed its checks")
    assert (
        said in done.stdout and "recipes: 7 jobs solved by a recipe, 4 by the agent" in done.stdout
    )
    report = (tmp_path / "out" / "report.html").read_text()
    assert said in report and f'href="recipes/{keys["A"]}-1.py"' in report

    listed = sandcell("recipe", "--list", "out/recipes", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    solved = Counter(r["recipe"] for r in got.values() if r["solved_by"] == "recipe")
    for path in library:
        count = solved.get(path.name, 0)
        assert f"{path.name}: layout {path.name.split('-')[0]} (csv" in listed.stdout
        assert f"solved {count} job" in listed.stdout.split(path.name)[1].split("\n")[0]
    assert "made from out/" in listed.stdout or "made from " in listed.stdout

    # next month's delivery: the same families and a new one, with the library given
    for path in tmp_path.glob("f*.csv"):
        path.unlink()
    later = tmp_path / "later"
    later.mkdir()
    family_of = delivery(later, {"A": 2, "B": 1, "C": 1, "D": 1, "E": 2}, start=50)
    before = digest(tmp_path / "out" / "recipes")
    model = FamilyModel(family_of)
    got, _ = batch(later, "out2", str(tmp_path / "out" / "recipes"), model)
    assert model.asked == {"E": 2}, model.asked  # no request for a known layout
    assert all(r["status"] == "answered" for r in got.values())
    assert digest(tmp_path / "out" / "recipes") == before  # DIR is never written
    assert len(list((later / "out2" / "recipes").glob("*.py"))) == 5


@pytest.mark.timeout(600)
def test_jobs_of_a_layout_being_learned_wait_for_that_one_agent_run(tmp_path):
    family_of = delivery(tmp_path, {"A": 3})
    model = FamilyModel(family_of, delay=3.0)  # the learning run is slow: the others wait
    got, _ = batch(tmp_path, "out", "auto", model, workers=2)
    assert model.asked == {"A": 2}, model.asked
    assert sorted(r["solved_by"] for r in got.values()) == ["agent", "recipe", "recipe"]


@pytest.mark.timeout(600)
def test_each_attempt_starts_on_a_clean_slate(tmp_path):
    family_of = delivery(tmp_path, {"A": 1})
    (name,) = family_of
    layout = Layout.of([tmp_path / name])
    lib = tmp_path / "lib"
    lib.mkdir()
    good = FAMILIES["A"][2].replace("'{path}'", "INPUTS[0]") + SAVE
    # tried first: writes a passing output and leaves a variable, then fails
    library_recipe(lib, f"{layout.key}-2.py", layout, [good + "left = 1", "raise ValueError('no')"])
    # tried next: would pass on those leftovers, fails on a clean slate
    library_recipe(lib, f"{layout.key}-1.py", layout, ["print(left)"])
    model = FamilyModel(family_of)
    got, _ = batch(tmp_path, "out", str(lib), model, workers=1)
    record = got[name[:-4]]
    assert record["recipes_tried"] == [f"{layout.key}-2.py", f"{layout.key}-1.py"]
    assert record["recipe_failure"] == {"cell": 1, "error": "NameError"}, record
    assert record["solved_by"] == "agent" and model.asked == {"A": 2}
    events = read_events(tmp_path / "out" / name[:-4] / "trace.jsonl")
    assert sum(isinstance(e, Reset) and e.reason == ATTEMPT for e in events) == 2
    told = model_first_message(tmp_path, name)
    assert "2 recipes that cleaned other files were tried" in told and "ValueError" in told
    # the replay renews its sandbox where the job did: the same NameError, the same cells
    replayed = sandcell("replay", f"out/{name[:-4]}/trace.jsonl", cwd=tmp_path, timeout=240)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


def model_first_message(folder, name: str) -> str:
    for event in read_events(folder / "out" / name[:-4] / "trace.jsonl"):
        task = getattr(event, "task", None)
        if task:
            return task
    return ""


@pytest.mark.timeout(120)
def test_library_usage_errors_come_before_anything_starts(tmp_path):
    delivery(tmp_path, {"A": 1})
    lib = tmp_path / "out" / "recipes"
    lib.mkdir(parents=True)
    own = sandcell(
        "batch", "jobs.jsonl", "--output", "out", "--recipe", "out/recipes", cwd=tmp_path
    )
    assert own.returncode == 2 and "this batch's own library" in own.stderr
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "broken.py").write_text("x = (\n")
    bad = sandcell("batch", "jobs.jsonl", "--output", "o2", "--recipe", "lib", cwd=tmp_path)
    assert bad.returncode == 2 and "broken.py does not parse" in bad.stderr
    assert not (tmp_path / "o2").exists()
    missing = sandcell("batch", "jobs.jsonl", "--output", "o3", "--recipe", "nope", cwd=tmp_path)
    assert missing.returncode == 2 and "no such recipe file or library folder" in missing.stderr
    listed = sandcell("recipe", "--list", "lib", cwd=tmp_path)
    assert listed.returncode == 2 and "broken.py does not parse" in listed.stderr
