"""Recipes end to end (issue 25): a recipe made from a scripted run, then a batch where most
files pass by the recipe with no model request, one file's recipe raises and one runs but
fails its checks (both handed to the agent and answered), `--recipe auto`, and a recipe
job's replay. Real CLI, real sandbox, a scripted model server."""

import json

import pytest

from sandcell.agent.events import Step
from sandcell.agent.records.trace import read_events
from tests.cli_runner import sandcell
from tests.deliveries import SALES, python
from tests.scripted_server import ScriptedServer

pytestmark = pytest.mark.docker

FAMILY = {  # vendor exports with the same habits: duplicated rows, negative amounts
    "a.csv": "id,amount,region\n1,10.5,N\n2,-3,S\n2,-3,S\n3,4,N\n",
    "b.csv": "id,amount,region\n7,1,S\n7,1,S\n8,2,N\n",
    "c.csv": "id,amount,region\n9,-1,N\n10,5,S\n",
    "d.csv": "id,amount,area\n11,1,N\n",  # no region column: the recipe raises (AttributeError)
    "e.csv": "id,amount,region\n12,1,N\n12,2,N\n",  # id 12 twice, not a duplicate row
    "f.csv": "id,amount,region\n13,2,S\n13,2,S\n",
    "g.csv": "id,amount,region\n14,3,N\n",
}
CLEAN = (
    "import pandas as pd\n"
    "df = pd.read_csv('/data/{name}').drop_duplicates()  # same habits, file after file\n"
    "df = df[(df.amount >= 0) & df.region.isin(['N', 'S'])]\n"
    "import os; os.makedirs('/workspace/output', exist_ok=True)\n"
    "df.to_csv('/workspace/output/clean.csv', index=False)\n"
)
CHECKED = {"output/clean.csv": "schemas/sales.yaml"}


def model_args(server: ScriptedServer) -> list[str]:
    return ["--base-url", server.url, "--api-key", "k", "--model", "m", "--protocol", "tools"]


@pytest.fixture
def family(tmp_path):
    for name, text in FAMILY.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "sales.yaml").write_text(SALES.to_yaml())
    return tmp_path


def jobs_file(folder, names: list[str]) -> str:
    lines = [
        json.dumps(
            {
                "id": n.split(".")[0],
                "task": f"Clean {n} into output/clean.csv",
                "inputs": [n],
                "expect": CHECKED,
            }
        )  # fmt: skip
        for n in names
    ]
    (folder / "jobs.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder / "jobs.jsonl")


def batch(family, names: list[str], recipe: str, script: list) -> tuple[dict, ScriptedServer]:
    """`sandcell batch` of these files' jobs with --recipe, one worker, the model scripted:
    each job's results line by id, and the server (its requests)."""
    jobs = jobs_file(family, names)
    with ScriptedServer(script) as server:
        done = sandcell(
            "batch", jobs, "--output", "out", "--workers", "1", "--no-progress",
            "--recipe", recipe, *model_args(server), cwd=family, timeout=450,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return results(family / "out"), server


def results(out) -> dict[str, dict]:
    lines = (out / "results.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


@pytest.mark.timeout(600)
def test_a_recipe_from_a_run_answers_most_of_a_batch_without_the_model(family):
    # the run: its first cell fails (left out of the recipe), its second builds the output
    script = [python("pd.read_csv('/data/a.csv').nope"), python(CLEAN.format(name="a.csv")),
              "Final Answer: cleaned."]  # fmt: skip
    with ScriptedServer(script) as server:
        run = sandcell(
            "run", "--task", "Clean a.csv into output/clean.csv", "--input", "a.csv",
            "--output", "run", "--expect", "output/clean.csv=schemas/sales.yaml",
            *model_args(server), cwd=family, timeout=280,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr
    made = sandcell("recipe", "run", "-o", "recipe.py", cwd=family)
    assert made.returncode == 0, made.stderr
    recipe = (family / "recipe.py").read_text()
    assert "pd.read_csv(INPUTS[0]).drop_duplicates()  # same habits" in recipe
    assert "INPUTS = ['/data/a.csv']" in recipe and ".nope" not in recipe
    assert "1 that failed or were stopped left out" in recipe
    checked = sandcell("recipe", "--check", "recipe.py", cwd=family)
    assert checked.returncode == 0 and "a list of 1 input path(s)" in checked.stdout

    # a cell a person added: which container ran the job (a recipe job's sandbox is renewed
    # and reused by the next job)
    with open(family / "recipe.py", "a") as f:
        f.write("\n# %%\nimport socket\nprint('host', socket.gethostname())\n")

    # the batch: b and c by the recipe; d raises in it, e fails its checks: the agent answers,
    # in a fresh kernel (nothing of the recipe is left: it reads the file again)
    fixes = [
        python("import pandas as pd\n"
               "df = pd.read_csv('/data/d.csv').rename(columns={'area': 'region'})\n"
               "df.to_csv('/workspace/output/clean.csv', index=False)"),
        "Final Answer: renamed area to region.",
        python("import pandas as pd\ndf = pd.read_csv('/data/e.csv').drop_duplicates('id')\n"
               "df.to_csv('/workspace/output/clean.csv', index=False)"),
        "Final Answer: kept one row per id.",
    ]  # fmt: skip
    names = ["b.csv", "c.csv", "f.csv", "g.csv", "d.csv", "e.csv"]
    got, server = batch(family, names, "recipe.py", fixes)
    solved = [got[j]["solved_by"] for j in "bcfgde"]
    assert solved == ["recipe"] * 4 + ["agent", "agent"]
    assert all(got[j]["checks"]["passed"] for j in "bcfgde")
    assert got["b"]["steps"] == 0 and got["c"]["tokens"] == 0
    # only the two handed-over jobs asked the model: two requests each
    assert len(server.requests) == 4
    first_d, first_e = server.requests[0]["messages"], server.requests[2]["messages"]
    told_d = next(m["content"] for m in first_d if m["role"] == "user")
    assert "A recipe (recipe.py)" in told_d and "AttributeError" in told_d, told_d
    assert "INPUTS[0]" in told_d and "Your kernel is a fresh one" in told_d
    told_e = next(m["content"] for m in first_e if m["role"] == "user")
    assert "its outputs failed their checks" in told_e and "field_uniqueness" in told_e
    assert got["d"]["recipe_failure"] == {"cell": 1, "error": "AttributeError"}
    assert got["b"]["recipe"] == "recipe.py" and got["d"]["recipes_tried"] == ["recipe.py"]
    assert got["e"]["recipe_failure"]["checks"]["passed"] is False
    assert (
        "Solved by the recipe [recipe.py](../../recipe.py)"
        in (family / "out" / "b" / "answer.md").read_text()
    )
    assert (
        family / "out" / "b" / "output" / "clean.csv"
    ).read_text() == "id,amount,region\n7,1,S\n8,2,N\n"

    # A recipe job's sandbox goes back to the pool, renewed while the next job runs in
    # another: with one worker, the pool (of one) and the first job's sandbox take turns, so
    # four recipe jobs ran in at most two containers.
    hosts = {j: _printed_host(family / "out" / j) for j in "bcfg"}
    assert all(hosts.values()) and len(set(hosts.values())) <= 2, hosts
    report = (family / "out" / "report.md").read_text()
    assert (
        report.count("answered by the recipe") == 4 and report.count("answered by the agent") == 2
    )


def _printed_host(folder) -> str | None:
    for event in read_events(folder / "trace.jsonl"):
        for ex in event.executions() if isinstance(event, Step) else []:
            for line in ex.stdout.splitlines():
                if line.startswith("host "):
                    return line.split()[1]
    return None


@pytest.mark.timeout(500)
def test_recipe_auto_learns_from_the_first_job_that_passes(family):
    script = [python(CLEAN.format(name="a.csv")), "Final Answer: cleaned."]
    got, server = batch(family, ["a.csv", "b.csv", "c.csv"], "auto", script)
    assert [got[j].get("solved_by") for j in "abc"] == ["agent", "recipe", "recipe"], got
    assert len(server.requests) == 2  # job a's two; none for b and c
    (learnt,) = (family / "out" / "recipes").iterdir()  # one layout: one recipe
    assert learnt.name == f"{got['a']['layout']}-1.py" and got["b"]["recipe"] == learnt.name
    assert "INPUTS = ['/data/a.csv']" in learnt.read_text()
    # a recipe job replays like any job: the same cells, the same outputs
    replayed = sandcell("replay", "out/b/trace.jsonl", cwd=family, timeout=180)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


@pytest.mark.timeout(120)
def test_a_recipe_needs_checks_on_every_job_and_a_real_recipe_file(family):
    jobs = family / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": "x", "task": "t", "inputs": ["a.csv"]}) + "\n")
    refused = sandcell("batch", str(jobs), "--output", "out", "--recipe", "auto", cwd=family)
    assert refused.returncode == 2 and "job 'x' has none" in refused.stderr
    (family / "bad.py").write_text("x = (\n")
    jobs_file(family, ["a.csv"])
    bad = sandcell("batch", str(jobs), "--output", "out", "--recipe", "bad.py", cwd=family)
    assert bad.returncode == 2 and "does not parse" in bad.stderr
    assert not (family / "out").exists()
