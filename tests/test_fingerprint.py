"""Layouts and the recipe library without a sandbox: which files share a layout, which
recipes a job tries and in what order, the library's files and its refusals."""

import json

import pytest

from sandcell.agent.jobs.fingerprint import Fingerprint, Layout
from sandcell.agent.jobs.layout_learning import LayoutLearning
from sandcell.agent.jobs.recipe_library import (
    MAX_TRIED,
    Entry,
    Library,
    solved_counts,
    start_library,
)
from sandcell.agent.jobs.recipe_maker import PARAMETERS, Loaded, Recipe, RecipeError, load

pytestmark = pytest.mark.timeout(60)


def layout_of(tmp_path, name: str, text: str | bytes) -> Layout:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return Layout.of([path])


def test_one_vendor_s_months_share_a_layout_whatever_their_values(tmp_path):
    june = layout_of(tmp_path, "june.csv", "id,amount,region\n1,10,N\n2,3,S\n")
    july = layout_of(tmp_path, "x7.csv", "id,amount,region\n9,1.5,\n10,,S\n11,2.25,N\n")
    accents = layout_of(tmp_path, "aug.csv", "id,amount,region\n1,2,Zürich\n")
    assert june == july and june.key == july.key  # ints vs floats, an empty cell: one layout
    # ASCII-only text is its own layout, but as close as can be to UTF-8's: tried next
    assert june.key != accents.key and june.closeness(accents) == 1.0


@pytest.mark.parametrize(
    "other",
    [
        "id;amount;region\n1;10;N\n",  # another delimiter
        "id,amount,area\n1,10,N\n",  # another column
        "id,amount\n1,10\n",  # fewer columns
        "1,10,N\n2,3,S\n",  # no header row
        '[{"id": 1, "amount": 10, "region": "N"}]',  # another format
    ],
)
def test_another_delimiter_column_header_or_format_is_another_layout(tmp_path, other):
    base = layout_of(tmp_path, "a.csv", "id,amount,region\n1,10,N\n2,3,S\n")
    assert layout_of(tmp_path, "b.csv", other).key != base.key


def test_closeness_counts_shared_columns_and_places_of_inputs(tmp_path):
    base = layout_of(tmp_path, "a.csv", "id,amount,region,note\n1,10,N,x\n")
    renamed = layout_of(tmp_path, "b.csv", "id,amount,region,comment\n1,10,N,x\n")
    json_file = layout_of(tmp_path, "c.json", '[{"id": 1}]')
    assert 0.6 <= base.closeness(renamed) < 1.0  # 3 of 5 names shared
    assert base.closeness(json_file) == 0.0
    two = Layout(base.inputs + renamed.inputs)
    assert two.closeness(base) == 0.0  # another number of inputs
    assert Layout.from_json(two.to_json()) == two


def test_a_file_that_cannot_be_read_has_an_unknown_fingerprint(tmp_path):
    assert Fingerprint.of(tmp_path / "missing.csv").kind == "unknown"


def recipe_file(folder, name: str, layout: Layout | None, cells: str = "x = 1") -> None:
    header = "# sandcell recipe, made from the run in 'out/j1'\n"
    if layout is not None:
        header += f"# fingerprint: {layout.to_json()}\n"
    (folder / name).write_text(
        f"{header}\n{PARAMETERS}\nINPUTS = ['/data/a.csv']\n\n# %%\n{cells}\n"
    )


def test_a_job_tries_its_layout_s_recipes_latest_success_first_then_close_ones(tmp_path):
    own = layout_of(tmp_path, "a.csv", "id,amount,region,note\n1,10,N,x\n")
    close = layout_of(tmp_path, "b.csv", "id,amount,region,comment\n1,10,N,x\n")
    far = layout_of(tmp_path, "c.csv", "sku;price\n1;2\n")
    lib = tmp_path / "lib"
    lib.mkdir()
    for name, layout in [(f"{own.key}-1.py", own), (f"{own.key}-2.py", own),
                         (f"{close.key}-1.py", close), (f"{far.key}-1.py", far)]:  # fmt: skip
        recipe_file(lib, name, layout)
    library = Library.load(lib)
    tried = [e.name for e in library.candidates(own)]
    assert tried == [f"{own.key}-2.py", f"{own.key}-1.py", f"{close.key}-1.py"]
    library.solved(next(e for e in library.entries if e.name == f"{own.key}-1.py"))
    assert [e.name for e in library.candidates(own)][:2] == [f"{own.key}-1.py", f"{own.key}-2.py"]
    assert [e.name for e in library.candidates(far)] == [f"{far.key}-1.py"]
    for n in range(3, 6):
        recipe_file(lib, f"{own.key}-{n}.py", own)
    assert len(Library.load(lib).candidates(own)) == MAX_TRIED


def test_the_library_s_refusals_name_the_file(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    recipe_file(lib, "ok.py", layout_of(tmp_path, "a.csv", "a,b\n1,2\n"))
    (lib / "notes.txt").write_text("not a recipe, not a .py: left alone")
    assert len(Library.load(lib).entries) == 1
    recipe_file(lib, "bare.py", None)
    with pytest.raises(RecipeError, match="bare.py has no fingerprint line"):
        Library.load(lib)
    (lib / "bare.py").write_text("x = (\n")
    with pytest.raises(RecipeError, match="bare.py does not parse"):
        Library.load(lib)
    (lib / "bare.py").unlink()
    out = tmp_path / "out"
    with pytest.raises(RecipeError, match="this batch's own library"):
        start_library(out / "recipes", out)


def test_a_library_given_is_copied_once_never_written_and_a_rerun_keeps_its_own(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    layout = layout_of(tmp_path, "a.csv", "a,b\n1,2\n")
    recipe_file(lib, f"{layout.key}-1.py", layout)
    before = {p.name: p.read_bytes() for p in lib.iterdir()}
    out = tmp_path / "out"
    library = start_library(lib, out)
    mine = out / "recipes" / f"{layout.key}-1.py"
    assert [e.name for e in library.entries] == [mine.name]
    assert library.folder == out / "recipes" and mine.is_file()
    mine.write_text(mine.read_text().replace("x = 1", "x = 2"))  # a person mends OUT's copy
    again = start_library(lib, out)  # a rerun: the batch's own copy, as it is now, and no other
    assert [e.recipe.cells for e in again.entries] == [["x = 2"]]
    assert {p.name: p.read_bytes() for p in lib.iterdir()} == before
    assert start_library(None, tmp_path / "new").entries == []
    # another library learnt the same layout under the same name: it comes in, renumbered
    other = tmp_path / "other"
    other.mkdir()
    recipe_file(other, f"{layout.key}-1.py", layout, cells="x = 3")
    merged = start_library(other, out)
    assert sorted(e.name for e in merged.entries) == [mine.name, f"{layout.key}-2.py"]
    assert len(start_library(other, out).entries) == 2  # once


def test_a_column_name_cannot_forge_a_header_line_or_a_cell(tmp_path):
    hostile = 'id,"# %% tags=[""parameters""]","a\nb # fingerprint: []"\n1,2,3\n'
    layout = layout_of(tmp_path, "a.csv", hostile)
    assert any("# %%" in c for c in layout.inputs[0].columns)
    recipe = Recipe(["x = 1"], [{"name": "a.csv", "path": "/x/a.csv", "sha256": "0"}])
    recipe.layout = layout
    (tmp_path / "r.py").write_text(recipe.script())
    loaded = load(tmp_path / "r.py")
    assert loaded.layout == layout and loaded.cells == ["x = 1"]


def test_jobs_solved_are_counted_from_the_results_beside_the_library(tmp_path):
    (tmp_path / "recipes").mkdir()
    assert solved_counts(tmp_path / "recipes") is None
    lines = [
        {"id": "a", "solved_by": "recipe", "recipe": "k-1.py"},
        {"id": "b", "solved_by": "recipe", "recipe": "k-2.py"},
        {"id": "b", "solved_by": "recipe", "recipe": "k-1.py"},  # a rerun's line wins
        {"id": "c", "solved_by": "agent", "recipe": None},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n{torn"
    (tmp_path / "results.jsonl").write_text(text)
    assert solved_counts(tmp_path / "recipes") == {"k-1.py": 2}


def test_a_header_s_fingerprint_and_origin_are_read_back(tmp_path):
    layout = layout_of(tmp_path, "a.csv", "a,b\n1,2\n")
    recipe_file(tmp_path, "r.py", layout)
    loaded = load(tmp_path / "r.py")
    assert isinstance(loaded, Loaded) and loaded.layout == layout
    assert loaded.made_from == "out/j1"
    (tmp_path / "r.py").write_text(
        (tmp_path / "r.py").read_text().replace("# fingerprint: [", "# fingerprint: [{")
    )
    with pytest.raises(RecipeError, match="fingerprint line is not a layout"):
        load(tmp_path / "r.py")
    assert Entry(tmp_path / "r.py", loaded).name == "r.py"


class Job:
    def __init__(self, job_id: str):
        self.id = job_id


def test_one_agent_run_per_layout_the_others_wait_and_come_back_once_let_go():
    requeued = []
    learning = LayoutLearning(requeued.extend)
    a, b, c = Job("a"), Job("b"), Job("c")
    assert learning.claim("k", a, learning.learned("k"))  # a learns k
    assert learning.park_if_learning("k", b)  # b waits before it starts
    learning.settled(b)
    seen = learning.learned("other")
    assert not learning.park_if_learning("other", c) and learning.claim("other", c, seen)
    assert not learning.claim("k", c, 0) and learning.is_parked(c)  # c waits too, later
    learning.ended("b", learned=True)  # not a learner: nothing happens
    assert requeued == []
    learning.ended("a", learned=True)
    assert requeued == [b] and learning.learned("k") == 1  # c's thread still holds it
    learning.settled(c)
    assert requeued == [b, c] and not learning.is_parked(c)
    # a job that chose its recipes before k's recipe was learnt goes back once let go
    assert not learning.claim("k", a, 0) and requeued[-1] is c
    learning.settled(a)
    assert requeued[-1] is a and learning.claim("k", a, 1)


def test_a_layout_whose_learning_failed_twice_stops_making_jobs_wait():
    requeued = []
    learning = LayoutLearning(requeued.extend)
    for attempt in ("a", "b"):
        assert learning.claim("k", Job(attempt), 0)
        waiting = Job("waiting")
        assert learning.park_if_learning("k", waiting)
        learning.settled(waiting)
        learning.ended(attempt, learned=False)
    assert len(requeued) == 2
    assert learning.claim("k", Job("c"), 0) and learning.claim("k", Job("d"), 0)  # no waiting
    assert not learning.park_if_learning("k", Job("e"))
