"""What comes back from a cell beyond plain values: charts whatever backend the code picks,
the complete output of a cell that printed too much (spilled to a workspace log), clear
words when code reaches for the network or pip, and output streamed while the cell runs."""

import re
import time

import pytest

from sandcell.sandbox import BackgroundSandbox, DockerSandbox, Inputs, Limits, boundary, render
from sandcell.sandbox.execution import Execution, ExecutionError, StreamChunk
from sandcell.sandbox.kernel import Collector

# a test's own timeout mark, where it has one, wins over the module's
pytestmark = pytest.mark.timeout(60)

docker_test = pytest.mark.docker
SLOW = Limits(timeout_s=120, interrupt_grace_s=2)
PNG = b"\x89PNG\r\n\x1a\n"
CUT = re.compile(r"\n\[\.\.\. (\d+) characters cut[^\n]*\]\n")


@pytest.fixture(scope="module")
def sb():
    with DockerSandbox(limits=SLOW) as sandbox:
        yield sandbox


def _figures(sb, ex) -> list[str]:
    """The saved PNG of each image result, checked on disk."""
    for path in ex.images:
        assert path.startswith(boundary.FIGURES + "/") and sb.read(path, max_bytes=8) == PNG
    assert all("image/png" in r.data for r in ex.results if r.path)
    return ex.images


# -- charts -------------------------------------------------------------------------------
@docker_test
def test_a_cell_that_never_imports_matplotlib_does_not_load_it():
    with DockerSandbox(limits=SLOW) as box:
        ex = box.run("import sys\nprint(1)\nsorted(m for m in sys.modules if 'matplotlib' in m)")
        assert ex.ok and ex.text == "[]", render(ex)


@docker_test
@pytest.mark.timeout(90)
def test_charts_under_agg_come_back_once_each():
    with DockerSandbox(limits=SLOW) as box:
        ex = box.run(
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "for n in (2, 3):\n    plt.plot(range(n))\n    plt.show()"
        )
        assert ex.ok, render(ex)
        assert len(set(_figures(box, ex))) == 2  # one per show(), each on its own figure
        assert box.run("1").images == []  # shown figures are not sent again
        ex = box.run("fig, ax = plt.subplots()\nax.bar([1, 2], [3, 4])\nfig.savefig('bar.png')")
        assert len(_figures(box, ex)) == 1, render(ex)  # left open at the end: sent once
        assert box.read("bar.png", max_bytes=8) == PNG
        assert box.run("None").images == []
        ex = box.run("fig = plt.figure()\nplt.plot([1, 2])\nplt.close(fig)")
        assert ex.ok and ex.images == []  # closed by the code: not sent
        ex = box.run(
            "fig, ax = plt.subplots()\nax.plot([1, 2])\nplt.show()\nprint(len(plt.get_fignums()))"
        )
        assert len(_figures(box, ex)) == 1 and ex.stdout == "0\n"


@docker_test
@pytest.mark.timeout(90)
def test_inline_figures_are_sent_once_and_saved_even_as_the_cell_value(sb):
    ex = sb.run(
        "import matplotlib.pyplot as plt\nfrom IPython.display import display\n"
        "fig, ax = plt.subplots()\nax.plot([1, 2])\ndisplay(fig)"
    )
    assert ex.ok and len(_figures(sb, ex)) == 1, render(ex)
    ex = sb.run("fig, ax = plt.subplots()\nax.plot([2, 1])\nfig")
    assert len(_figures(sb, ex)) == 1 and ex.results[0].is_main, render(ex)
    assert "not saved" not in render(ex)
    ex = sb.run("plt.plot([1, 3])\nplt.show()")
    assert len(_figures(sb, ex)) == 1
    ex = sb.run("plt.ioff()\nplt.plot([3, 1])\nplt.savefig('line.png')")  # no draw: still open
    assert len(_figures(sb, ex)) == 1, render(ex)
    assert sb.run("plt.ion()").images == []


# -- the complete output of a cell ---------------------------------------------------------
FIVE_MILLION = "for i in range(624999):\n    print(f'{i:07d}')\nprint('the end!', end='')"  # 624999 lines of 8 characters and 8 more: 5,000,000 characters


def _marker(observation: str, full: str) -> tuple[int, str]:
    """The cut marker's count, checked against what the model sees of the full text."""
    found = CUT.search(observation)
    assert found, observation
    head, tail = observation[: found.start()], observation[found.end() :]
    assert full.startswith(head) and full.endswith(tail)
    assert int(found.group(1)) == len(full) - len(head) - len(tail)
    return int(found.group(1)), found.group(0)


@docker_test
@pytest.mark.timeout(180)
def test_five_million_characters_spill_whole_and_the_marker_counts_exactly(sb):
    full = "".join(f"{i:07d}\n" for i in range(624999)) + "the end!"
    assert len(full) == 5_000_000
    ex = sb.run(FIVE_MILLION)
    assert ex.ok, render(ex)
    assert ex.saved_output == f"{boundary.LOGS}/cell-{ex.execution_count}.txt", ex.saved_output
    assert sb.read(ex.saved_output) == full.encode()
    for budget in (4000, 1000):
        count, marker = _marker(render(ex, budget), full)
        assert count > 4_990_000 and ex.saved_output in marker and "truncated" not in marker
    assert ex.stdout.startswith("0000000\n") and ex.stdout.endswith("0624998\nthe end!")
    assert len(ex.stdout) <= sb.limits.output_bytes + 200
    exported = [f["path"] for f in sb.files()]
    assert ex.saved_output.removeprefix(boundary.WORKSPACE + "/") in exported


@docker_test
@pytest.mark.timeout(180)
def test_output_over_the_spill_cap_is_saved_up_to_the_cap_and_says_so(sb):
    cap = sb.limits.spill_bytes
    ex = sb.run("line = 'y' * (1 << 20)\nfor _ in range(65):\n    print(line, end='')")
    assert ex.ok and cap < (65 << 20), render(ex)
    assert sb.stat(ex.saved_output)["size"] == cap
    _, marker = _marker(render(ex), "y" * (65 << 20))
    assert "truncated" in marker and ex.saved_output in marker


@docker_test
def test_the_spill_cap_comes_from_limits():
    with DockerSandbox(limits=Limits(spill_bytes=10_000)) as box:
        assert box.run("print('z' * 50_000)").saved_truncated == 10_000


@docker_test
def test_the_tail_after_a_cut_keeps_stdout_and_stderr_in_order(sb):
    ex = sb.run(
        "import sys\nprint('x' * (1 << 20))\n"
        "for i in range(3):\n    print(f'out {i}', flush=True)\n"
        "    print(f'err {i}', file=sys.stderr, flush=True)"
    )
    after = [(c.name, c.text) for c in ex.stream[ex.cut_at + 1 :]]
    assert after[0][0] == "stdout" and after[0][1].endswith("x\nout 0\n"), after
    assert after[1:] == [
        ("stderr", "err 0\n"), ("stdout", "out 1\n"), ("stderr", "err 1\n"),
        ("stdout", "out 2\n"), ("stderr", "err 2\n"),
    ]  # fmt: skip


@docker_test
def test_short_output_writes_no_log(sb):
    ex = sb.run("print('short')")
    assert ex.saved_output is None and render(ex) == "short"


def test_the_collector_keeps_one_exact_gap_between_head_and_tail():
    """The kernel's cut and the host's own cap meet in one gap whose size is exact."""
    collector = Collector("code", cap=100)
    for text in ["a" * 30, "b" * 30 + boundary.dropped_marker("stdout", 1000), "c" * 80]:
        collector.add({"msg_type": "stream", "content": {"name": "stdout", "text": text}})
    ex = collector.finish(0.1)
    assert ex.cut_chars == ex.dropped_bytes == 1000 + 10 + 30  # kernel, host head, host tail
    kept = "".join(c.text for i, c in enumerate(ex.stream) if i != ex.cut_at)
    assert kept == "a" * 30 + "b" * 20 + "c" * 50
    assert "1040 characters cut" in ex.stdout  # a plain reader of stdout sees the cut too
    full = "a" * 30 + "b" * 30 + "x" * 1000 + "c" * 80
    count, _ = _marker(render(ex, 90), full)
    assert count > ex.cut_chars  # the observation shows less than the host kept


# -- offline by design ----------------------------------------------------------------------
NETWORK_CELLS = [
    "import urllib.request\nurllib.request.urlopen('https://pypi.org', timeout=5)",
    "import socket\nsocket.getaddrinfo('example.com', 443)",
    "import urllib.request\ntry:\n    urllib.request.urlopen('http://example.com')\n"
    "except Exception as e:\n    print('failed:', e)",
]


@docker_test
@pytest.mark.parametrize("code", NETWORK_CELLS, ids=["urlopen", "getaddrinfo", "caught"])
def test_network_attempts_say_the_sandbox_is_offline(sb, code):
    observation = render(sb.run(code))
    notes = [line for line in observation.splitlines() if "offline by design" in line]
    assert len(notes) == 1, observation
    assert "pandas" in notes[0] and "sandcell packages add NAME" in notes[0]
    assert boundary.PACKAGES_FILE in notes[0]


@docker_test
@pytest.mark.parametrize("code", ["%pip install nonexistent-pkg", "!pip install nonexistent-pkg"])
def test_a_failed_pip_install_is_a_failed_cell_and_quick(sb, code):
    ex = sb.run(code + "\nprint('not reached')")
    assert not ex.ok and ex.error is not None, render(ex)
    assert "not reached" not in ex.stdout
    # no retries waited out against a missing network (pip says "Retrying" before each); pip
    # itself takes 2.5 s under gVisor when quiet, several times that beside the parallel suite
    assert "Retrying" not in render(ex) and ex.duration_s < 30, ex.duration_s
    assert "offline by design" in render(ex)
    assert sb.run("!pip --version").ok  # other pip commands still run


@docker_test
def test_the_image_lists_its_packages(sb):
    listing = sb.read(boundary.PACKAGES_FILE).decode()
    for name in ("pandas", "polars", "duckdb", "matplotlib", "ipykernel"):
        assert re.search(rf"^{name}==", listing, re.M | re.I), name


def test_the_offline_note_is_one_line_from_the_execution_alone():
    def note_lines(ex):
        return [x for x in render(ex).splitlines() if "offline by design" in x]

    gai = ExecutionError("gaierror", "[Errno -3] Temporary failure in name resolution", [])
    assert len(note_lines(Execution(error=gai))) == 1
    printed = Execution(stream=[StreamChunk("stderr", "ConnectionError: Network is unreachable\n")])
    assert len(note_lines(printed)) == 1
    assert (
        note_lines(Execution(error=ExecutionError("ZeroDivisionError", "division by zero", [])))
        == []
    )
    assert note_lines(Execution(stream=[StreamChunk("stdout", "connected rows: 5\n")])) == []


# -- streaming ---------------------------------------------------------------------------
@docker_test
def test_output_reaches_on_output_while_the_cell_runs():
    arrived: list[tuple[float, StreamChunk]] = []
    box = BackgroundSandbox(lambda: DockerSandbox(limits=SLOW), SLOW, Inputs.from_paths([]))
    try:
        box.ready()
        started = time.monotonic()
        ex = box.run(
            "import sys, time\nfor i in range(6):\n    print(f'tick {i}', flush=True)\n"
            "    print(f'warn {i}', file=sys.stderr, flush=True)\n    time.sleep(0.5)",
            on_output=lambda chunk: arrived.append((time.monotonic(), chunk)),
        )
        returned = time.monotonic()
    finally:
        box.close()
    assert ex.ok, render(ex)
    assert arrived and arrived[0][1] == StreamChunk("stdout", "tick 0\n")
    first, last = arrived[0][0], arrived[-1][0]
    assert first - started < (returned - started) / 2 and first < last  # while it ran
    for name in ("stdout", "stderr"):
        streamed = "".join(c.text for _, c in arrived if c.name == name)
        assert streamed == "".join(c.text for c in ex.stream if c.name == name)
