"""Charts and tables as data (issue 50), in a real sandbox: each figure a cell shows carries its
chart (type, title, axes, the values plotted), each DataFrame its first rows; both bounded in
the kernel, and checked again on the host, where a forged one is dropped with a note."""

import json

import numpy as np
import pytest

from sandcell import Agent, OpenAIModel, Rules
from sandcell.sandbox import DockerSandbox, Limits, boundary, render
from tests.cli_runner import sandcell
from tests.mcp_helpers import over_stdio
from tests.scripted_server import ScriptedServer
from tests.serve_helpers import client, config, execute, new_session, serving
from tests.test_sandbox_rich import peak_rss_mb

pytestmark = [pytest.mark.docker, pytest.mark.timeout(120), pytest.mark.xdist_group("charts")]
PLT = "import matplotlib.pyplot as plt\n"


@pytest.fixture(scope="module")
def sb():
    with DockerSandbox(limits=Limits(timeout_s=60)) as sandbox:
        yield sandbox


def charts(sb, code: str) -> list[dict | None]:
    ex = sb.run(PLT + code)
    assert ex.ok, ex
    assert all(r.data.get("image/png") for r in ex.results), ex.results  # the picture stays
    assert not [n for r in ex.results for n in r.notes], ex.results
    return [r.chart for r in ex.results]


def test_a_line_chart_of_two_series_gives_its_points_title_axes_and_units(sb):
    (chart,) = charts(
        sb,
        "plt.plot([1, 2, 3], [4.5, 5, 6], label='north')\n"
        "plt.plot([1, 2, 3], [1, 0, 2], label='south')\n"
        "plt.title('Sales'); plt.xlabel('Month'); plt.ylabel('Revenue (USD)')\nplt.show()",
    )
    assert chart["type"] == "line" and chart["title"] == "Sales"
    assert (chart["x_label"], chart["y_label"], chart["y_unit"]) == (
        "Month",
        "Revenue (USD)",
        "USD",
    )
    assert chart["elements"] == [
        {"label": "north", "points": [[1, 4.5], [2, 5], [3, 6]], "truncated": None},
        {"label": "south", "points": [[1, 1], [2, 0], [3, 2]], "truncated": None},
    ]
    assert chart["x_scale"] == "linear" and chart["x_ticks"] and chart["x_tick_labels"]


def test_a_grouped_bar_chart_names_each_bar_s_category_and_group(sb):
    (chart,) = charts(
        sb,
        "import numpy as np\nx = np.arange(3)\n"
        "plt.bar(x - 0.2, [10, 20, 30], 0.4, label='2023')\n"
        "plt.bar(x + 0.2, [12, 18, 33.5], 0.4, label='2024')\n"
        "plt.xticks(x, ['North', 'South', 'East'])\nplt.show()",
    )
    assert chart["type"] == "bar"
    got = [(e["group"], e["label"], e["value"]) for e in chart["elements"]]
    assert got == [
        ("2023", "North", 10), ("2023", "South", 20), ("2023", "East", 30),
        ("2024", "North", 12), ("2024", "South", 18), ("2024", "East", 33.5),
    ]  # fmt: skip


def test_a_scatter_a_pie_and_a_box_plot_give_their_values(sb):
    scatter, pie, box = charts(
        sb,
        "plt.scatter([1, 2, 3], [3, 1, 2], label='points'); plt.show()\n"
        "plt.pie([1, 3], labels=['cats', 'dogs']); plt.show()\n"
        "plt.boxplot([[1, 2, 3, 4, 5, 6, 7, 8, 9, 40]], tick_labels=['scores']); plt.show()",
    )
    assert scatter["type"] == "scatter"
    assert scatter["elements"][0]["points"] == [[1, 3], [2, 1], [3, 2]]
    assert pie["type"] == "pie"
    assert [(w["label"], w["angle"]) for w in pie["elements"]] == [("cats", 90), ("dogs", 270)]
    assert box["type"] == "box_and_whisker"
    (one,) = box["elements"]
    data = [1, 2, 3, 4, 5, 6, 7, 8, 9, 40]
    q1, median, q3 = np.percentile(data, [25, 50, 75])
    assert one["label"] == "scores" and one["outliers"] == [40]
    assert (one["first_quartile"], one["median"], one["third_quartile"]) == (q1, median, q3)
    assert (one["min"], one["max"]) == (1, 9)


def test_seaborn_a_two_axes_figure_and_an_empty_figure(sb):
    seaborn, two, empty = charts(
        sb,
        "import seaborn as sns\n"
        "sns.barplot(x=['a', 'b', 'c'], y=[3, 5, 4]); plt.title('seaborn'); plt.show()\n"
        "fig, (left, right) = plt.subplots(1, 2); fig.suptitle('both')\n"
        "left.plot([0, 1], [2, 3]); right.bar(['x', 'y'], [7, 8]); plt.show()\n"
        "fig, ax = plt.subplots(); plt.show()",
    )
    assert seaborn["type"] == "bar" and seaborn["title"] == "seaborn"
    assert [(e["label"], e["value"]) for e in seaborn["elements"]] == [("a", 3), ("b", 5), ("c", 4)]
    assert two["type"] == "superchart" and two["title"] == "both"
    line, bar = two["elements"]
    assert line["type"] == "line" and line["elements"][0]["points"] == [[0, 2], [1, 3]]
    assert bar["type"] == "bar" and [e["value"] for e in bar["elements"]] == [7, 8]
    assert empty is None  # nothing plotted: the image, no chart


def test_a_million_points_come_back_bounded_and_say_so(sb):
    (chart,) = charts(
        sb, "plt.plot(range(1_000_000), [v % 1000 for v in range(1_000_000)]); plt.show()"
    )
    (series,) = chart["elements"]
    assert series["truncated"] == {"points": 1_000_000, "kept": len(series["points"])}
    assert len(series["points"]) <= boundary.CHART_POINTS
    assert series["points"][0] == [0, 0] and series["points"][-1] == [999_999, 999]  # whole range
    text = render(sb.run(PLT + "plt.plot(range(10_000)); plt.show()"))
    assert "10,000 points, x 0 to 9999, y 0 to 9999" in text, text


def test_a_data_frame_s_text_is_bounded_under_pandas_3_and_its_table_says_its_shape(sb):
    ex = sb.run("import pandas as pd\npd.DataFrame({'a': range(50), 'b': ['x'] * 50})")
    text, table = ex.text, ex.results[0].table
    assert "[50 rows x 2 columns]" in text and len(text.splitlines()) <= 30 + 3, text
    assert table["shape"] == [50, 2] and len(table["rows"]) == boundary.TABLE_ROWS
    assert table["columns"] == [{"name": "a", "dtype": "int64"}, {"name": "b", "dtype": "str"}]
    assert table["rows"][0] == [0, "x"] and table["index"]["values"][:2] == [0, 1]
    ex = sb.run("import numpy as np\npd.DataFrame(np.zeros((10_000, 50)))")
    text, table = ex.text, ex.results[0].table
    assert "[10000 rows x 50 columns]" in text and len(text) < 8000, len(text)
    assert table["shape"] == [10_000, 50] and len(table["rows"]) <= boundary.TABLE_ROWS
    assert len(json.dumps(table)) <= boundary.DATA_BYTES


FORGED = "from IPython.display import display\nM = 'application/vnd.sandcell.chart+json'\n"


def test_a_forged_chart_is_dropped_with_a_note(sb):
    ex = sb.run(
        FORGED + "display({M: 'not json', 'text/plain': 'a'}, raw=True)\n"
        'display({M: \'{"type": "line", "elements": [{"nope": 1}]}\', \'text/plain\': \'b\'}, raw=True)\n'
        "display({M: {'type': 'pie'}, 'text/plain': 'c'}, raw=True)"
    )
    assert [r.chart for r in ex.results] == [None, None, None]
    notes = [r.notes for r in ex.results]
    assert "invalid json" in notes[0][0].lower() and "elements.0" in notes[1][0], notes
    assert "not JSON text" in notes[2][0]
    assert all(boundary.CHART_MIME not in r.data for r in ex.results)
    text = render(ex)
    assert "[a chart's data was dropped" in text, text


@pytest.mark.timeout(240)
def test_six_megabytes_of_forged_points_add_no_chart_and_keep_the_host_small():
    six_mb = FORGED + "display({M: '[' + '1.0,' * (1_500_000) + '1]', 'text/plain': 'x'}, raw=True)"
    run = sandcell("exec", "-c", six_mb)
    assert run.returncode == 0 and "over the 128 KiB a chart or table may send" in run.stdout
    base = peak_rss_mb("exec", "-c", "1")
    assert peak_rss_mb("exec", "-c", six_mb) - base <= 64


BARS = (
    "import matplotlib.pyplot as plt\n"
    "plt.bar(['North', 'South', 'East'], [120.5, 98.1, 80]); plt.title('Sales by region')\n"
    "plt.show()"
)


def test_a_text_only_model_reads_the_values_of_its_chart(tmp_path):
    script = [
        {"tool_calls": [{"name": "python", "arguments": {"code": BARS}}]},
        "The bars show North 120.5.",
    ]  # fmt: skip
    with ScriptedServer(script) as server:
        model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
        result = Agent(model, rules=Rules(), protocol="tools").run(
            "Chart sales", output_dir=tmp_path
        )
    assert result.answered, result
    observation = next(m for m in server.requests[1]["messages"] if m["role"] == "tool")
    assert '[bar chart "Sales by region"]' in observation["content"], observation
    assert "North 120.5, South 98.1, East 80" in observation["content"], observation


def test_the_api_s_execute_the_notebook_and_mcp_carry_the_chart_and_the_table(tmp_path):
    cell = BARS + "\nimport pandas as pd\npd.DataFrame({'units': [1, 2]})"
    with (
        ScriptedServer(["Final Answer: unused."]) as server,
        serving(config(server, tmp_path / "data")) as base,
        client(base) as api,
    ):
        sid = new_session(api)
        r = execute(api, sid, cell)
        assert r.status_code == 200, r.text
        chart, table = r.json()["results"][0]["chart"], r.json()["results"][1]["table"]
        assert [b["value"] for b in chart["elements"]] == [120.5, 98.1, 80]
        assert table["shape"] == [2, 1] and r.json()["results"][0]["table"] is None
        notebook = api.get(f"/api/sessions/{sid}/notebook").json()
    outputs = [o for c in notebook["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    kept = [o["data"].get(boundary.CHART_MIME) for o in outputs if "data" in o]
    assert chart in kept  # as JSON under its MIME type

    async def scenario(session):
        return await session.call_tool("run_python", {"code": cell})

    result = over_stdio(scenario)
    assert [b["label"] for b in result.structuredContent["charts"][0]["elements"]] == [
        "North", "South", "East"
    ]  # fmt: skip
    assert result.structuredContent["tables"][0]["rows"] == [[1], [2]]
    assert any(c.type == "image" for c in result.content)
