"""Recipes without a sandbox: the cells a trace gives, input paths as parameters (rewritten on
the syntax tree: comments, layout, f-strings and concatenations), the script's format, and
reading a recipe back. The batch runs of recipes are in test_recipe_batch.py."""

import ast
from pathlib import Path

import pytest

from sandcell.agent.events import ChecksRun, Final, Reset, SessionStarted, executed_cell
from sandcell.agent.jobs.recipe_maker import (
    PARAMETERS,
    Recipe,
    RecipeError,
    from_run,
    load,
    parameterize,
    parameters_cell,
    plain_python,
)
from sandcell.agent.records.trace import TraceWriter
from sandcell.sandbox import Execution
from sandcell.sandbox.execution import ExecutionError

INPUTS = [
    {"name": "sales.csv", "path": "/home/a/sales.csv", "size": 10, "sha256": "ab" * 32},
    {"name": "rates.csv", "path": "/home/a/rates.csv", "size": 5, "sha256": "cd" * 32},
]


def test_every_literal_input_path_becomes_a_parameter_and_the_rest_stays():
    code = (
        "import pandas as pd\n"
        "# the sales, then the rates\n"
        'df = pd.read_csv("/data/sales.csv")  # as given\n'
        "rates = pd.read_csv('/data/rates.csv', sep=';')\n"
        'print(f"read /data/sales.csv: {len(df)} rows")\n'
        'both = "cat /data/sales.csv /data/rates.csv".split()\n'
        'joined = ("/data/" "sales.csv")\n'
        'raw = b"/data/sales.csv"\n'
        'other = "/data/sales.csv.bak"\n'
        'out = "/workspace/output/clean.csv"\n'
    )
    got = parameterize(code, INPUTS)
    assert "# the sales, then the rates" in got and "# as given" in got
    assert "pd.read_csv(INPUTS[0])" in got and "pd.read_csv(INPUTS[1], sep=';')" in got
    assert 'f"read {INPUTS[0]}: {len(df)} rows"' in got
    assert "('cat ' + INPUTS[0] + ' ' + INPUTS[1]).split()" in got
    assert "joined = INPUTS[0]" in got
    assert 'raw = b"/data/sales.csv"' in got  # bytes are not paths
    assert 'other = "/data/sales.csv.bak"' in got  # another file
    assert 'out = "/workspace/output/clean.csv"' in got
    namespace = {"INPUTS": ["/in/x.csv", "/in/y.csv"]}
    exec(compile("both = " + got.split("both = ")[1].split("\n")[0], "<cell>", "exec"), namespace)
    assert namespace["both"] == ["cat", "/in/x.csv", "/in/y.csv"]


def test_a_cell_that_does_not_parse_is_kept_as_it_ran():
    assert parameterize("%timeit 1\n", INPUTS) == "%timeit 1\n"


def _trace(
    folder: Path,
    cells: list[tuple[str, Execution]],
    reset_after: int | None = None,
    passed: bool | None = True,
):
    with TraceWriter(folder / "trace.jsonl") as trace:
        trace(SessionStarted(model="m", max_tokens=None, protocol="tools", inputs=INPUTS,
                             image="i", limits={}, rules={}, sandbox_start="fresh"))  # fmt: skip
        for n, (code, ex) in enumerate(cells):
            ex.code = code
            trace(executed_cell(1, code, ex))
            if n == reset_after:
                trace(Reset(question=1))
        if passed is not None:
            outputs = {"output/clean.csv": {"passed": passed, "sha256": "ef" * 32, "failures": []}}
            trace(ChecksRun(question=1, attempt=1, passed=passed, outputs=outputs, duration_s=1.0))
        trace(Final(question=1, tokens=9, duration_s=2.0, answer="done", stop_reason="answered",
                    detail="", error=None, steps=3))  # fmt: skip


def test_the_recipe_keeps_the_cells_that_ran_and_names_its_origin(tmp_path):
    _trace(tmp_path, [
        ("import pandas as pd", Execution()),
        ("df = pd.read_csv('/data/sales.csv')\ndf.nope", Execution(error=ExecutionError("AttributeError", "nope", []))),
        ("while True: pass", Execution(timed_out=True, interrupted=True)),
        ("df = pd.read_csv('/data/sales.csv')", Execution()),
        ("df.drop_duplicates().to_csv('/workspace/output/clean.csv')", Execution()),
    ])  # fmt: skip
    recipe = from_run(tmp_path)
    assert recipe.left_out == 2 and len(recipe.cells) == 3
    script = recipe.script()
    ast.parse(script)
    assert script.count("\n# %%\n") == 3 and PARAMETERS in script
    assert "INPUTS = ['/data/sales.csv', '/data/rates.csv']" in script
    assert "df.nope" not in script and "while True" not in script
    assert f"INPUTS[0] '/home/a/sales.csv'  {'ab' * 32}" in script
    assert f"'output/clean.csv'  {'ef' * 32}" in script
    path = tmp_path / "recipe.py"
    path.write_text(script)
    loaded = load(path)
    assert loaded.inputs == 2 and loaded.cells[0] == "import pandas as pd"
    assert loaded.cells[1] == "df = pd.read_csv(INPUTS[0])"


def test_a_reset_drops_the_cells_before_it(tmp_path):
    _trace(tmp_path, [("a = 1", Execution()), ("b = 2", Execution())], reset_after=0)
    assert from_run(tmp_path).cells == ["b = 2"]


@pytest.mark.parametrize("passed", [False, None])
def test_a_run_whose_outputs_did_not_pass_declared_checks_makes_no_recipe(tmp_path, passed):
    _trace(tmp_path, [("a = 1", Execution())], passed=passed)
    with pytest.raises(RecipeError, match="passed declared checks"):
        from_run(tmp_path)


def test_a_recipe_job_s_own_parameters_cell_is_not_a_cell_of_the_next_recipe(tmp_path):
    _trace(tmp_path, [("INPUTS = ['/data/x.csv']", Execution()), ("b = 2", Execution())])
    assert from_run(tmp_path).cells == ["b = 2"]


def test_folders_and_files_that_are_no_recipe_are_refused_saying_why(tmp_path):
    with pytest.raises(RecipeError, match="no trace.jsonl"):
        from_run(tmp_path)
    _trace(tmp_path, [("1/0", Execution(error=ExecutionError("ZeroDivisionError", "", [])))])
    with pytest.raises(RecipeError, match="ran no cell to its end"):
        from_run(tmp_path)
    bad = tmp_path / "bad.py"
    bad.write_text("# %%\nx = (\n")
    with pytest.raises(RecipeError, match="does not parse: line"):
        load(bad)
    bad.write_text("# %%\nx = 1\n")
    with pytest.raises(RecipeError, match="first cell must be the parameters cell"):
        load(bad)
    bad.write_text(f"{PARAMETERS}\nX = 1\n# %%\nx = 1\n")
    with pytest.raises(RecipeError, match="must set INPUTS"):
        load(bad)


def test_what_a_script_cannot_hold_is_commented_out_or_kept_as_it_ran():
    magic = "%matplotlib inline\n!ls /data\nx = 1\n"
    held = plain_python(magic)
    assert (
        held is not None and "x = 1" in held and "# (IPython, left out of the recipe) !ls" in held
    )
    assert plain_python("x = (\n") is None
    # a rewrite that would not parse on 3.11 (quotes inside an f-string's expression), and a
    # `case` pattern: the cell stays as it ran, a job then fails on its path and the agent takes over
    for code in ("import glob\nf'{glob.glob(\"/data/sales.csv*\")}'\n",
                 "match p:\n    case '/data/sales.csv':\n        pass\n"):  # fmt: skip
        assert parameterize(code, INPUTS) == code
    assert (
        parameterize("p = '/workspace/data/sales.csv'\n", INPUTS)
        == "p = '/workspace/data/sales.csv'\n"
    )


def test_a_hostile_input_name_cannot_put_code_in_the_header(tmp_path):
    hostile = [{**INPUTS[0], "path": "/h/q.csv\nimport os; os.system('x') #"}]
    recipe = Recipe(["a = 1"], hostile, source="/runs/x\nimport sys", checks={"o\nimport y": "ab"})
    body = ast.parse(recipe.script()).body
    assert [type(node).__name__ for node in body] == ["Assign", "Assign"]


def test_a_parameters_cell_a_person_extended_and_a_marker_inside_a_string_are_kept(tmp_path):
    path = tmp_path / "recipe.py"
    path.write_text(
        f"# header\n{PARAMETERS}\nINPUTS = ['/data/a.csv']\nSEP = ';'\n\n"
        '# %%\ns = """\n# %% not a cell\n"""\nprint(s)\n'
    )
    loaded = load(path)
    assert loaded.cells == ['s = """\n# %% not a cell\n"""\nprint(s)']
    first = parameters_cell(["/data/b.csv"], loaded.parameters)
    namespace: dict = {}
    exec(first, namespace)
    assert namespace["SEP"] == ";" and namespace["INPUTS"] == ["/data/b.csv"]
