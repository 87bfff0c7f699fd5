"""Rich outputs (displays and a cell's value) are capped per cell by count and by bytes: in the
kernel, and again on the host, which holds even when model code gets round the kernel's cap.
What is dropped is counted exactly and named in the observation; the host never holds it."""

import json
import subprocess
import time

import psutil
import pytest

from sandcell.sandbox import DockerSandbox, Limits, boundary
from sandcell.sandbox.execution import Execution
from sandcell.sandbox.kernel import Collector
from sandcell.sandbox.render import render
from tests import cli_runner

docker_test = pytest.mark.docker


@pytest.fixture(scope="module")
def runtime(runtime, transport):
    """Each sandbox test here runs under each runtime, and over each transport (the output
    caps hold the same over the engine's API alone)."""
    if transport == "podman" and runtime == "runsc":
        pytest.skip("Podman's Docker API takes no runtime: gVisor is not reachable through it")
    return runtime


# Model code that sends a display past the kernel extension's wrapper: the publisher's own
# class method (the extension wraps the instance), and the session's send with a message
# built by hand.
BYPASS = {
    "publish": "ip = get_ipython()\n"
    "def send(data): type(ip.display_pub).publish(ip.display_pub, data)\n",
    "session": "ip = get_ipython()\npub = ip.display_pub\n"
    "def send(data):\n"
    "    content = {'data': data, 'metadata': {}, 'transient': {}}\n"
    "    pub.session.send(pub.pub_socket, 'display_data', content, parent=pub.parent_header,"
    " ident=pub.topic)\n",
}


def size(text: str) -> int:
    """rich_size of a display of text as the tests send it ({'text/plain': text}, {})."""
    return boundary.rich_size({"text/plain": text}, {})


def observation_names(ex: Execution) -> None:
    n = ex.rich_dropped
    assert f"[{n} displayed output{'s were' if n > 1 else ' was'} dropped (" in render(ex)


# -- the kernel's cap -------------------------------------------------------------------------
@docker_test
@pytest.mark.timeout(120)
def test_a_15_mib_display_under_a_cap_that_allows_it_comes_back_whole(runtime):
    """Within the caps a big display arrives whole, over either transport, under runc and
    runsc (over the stream transport it crosses the bridge as one framed message)."""
    limits = Limits(rich_bytes=32 << 20, timeout_s=60, runtime=runtime)
    with DockerSandbox(limits) as sb:
        ex = sb.run(
            "from IPython.display import display\n"
            "display({'text/plain': ''.join(chr(97 + i % 26) for i in range(15 << 20))}, raw=True)"
        )
        assert ex.ok and ex.rich_dropped == 0, render(ex)
        text = ex.results[0].data["text/plain"]
        assert len(text) == 15 << 20 and text == "".join(chr(97 + i % 26) for i in range(15 << 20))


@docker_test
@pytest.mark.timeout(120)
def test_displays_past_the_count_cap_are_dropped_and_counted(runtime):
    texts = [f"display {i} " + "x" * i for i in range(12)]
    with DockerSandbox(limits=Limits(rich_outputs=5), runtime=runtime) as box:
        ex = box.run(
            "from IPython.display import display\n"
            f"for text in {texts!r}: display({{'text/plain': text}}, raw=True)\n"
            "'the value'"
        )
        assert ex.ok, render(ex)
        assert [r.data["text/plain"] for r in ex.results] == texts[:5]
        assert ex.rich_dropped == 7 + 1  # and the cell's value
        assert ex.rich_dropped_bytes == sum(map(size, texts[5:])) + size("'the value'")
        observation_names(ex)
        again = box.run("display({'text/plain': 'next cell'}, raw=True)")  # counts per cell
        assert [r.data["text/plain"] for r in again.results] == ["next cell"]
        assert again.rich_dropped == again.rich_dropped_bytes == 0
        assert "dropped" not in render(again)


@docker_test
@pytest.mark.timeout(120)
def test_displays_past_the_byte_cap_are_dropped_and_counted(runtime):
    with DockerSandbox(limits=Limits(rich_bytes=100_000), runtime=runtime) as box:
        ex = box.run(
            "from IPython.display import display\n"
            "for n in (40_000, 40_000, 40_000, 15 << 20, 1000):\n"
            "    display({'text/plain': 'x' * n}, raw=True)"
        )
        assert ex.ok, render(ex)
        kept = [len(r.data["text/plain"]) for r in ex.results]
        assert kept == [40_000, 40_000, 1000]  # a later small one still fits
        assert sum(map(size, ["x" * n for n in kept])) <= 100_000
        assert ex.rich_dropped == 2
        assert ex.rich_dropped_bytes == size("x" * 40_000) + size("x" * (15 << 20))
        observation_names(ex)
        assert "(15 MiB)" in render(ex)


# -- the host's cap ---------------------------------------------------------------------------
@docker_test
@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", sorted(BYPASS))
def test_the_host_cap_holds_when_model_code_gets_round_the_kernel(runtime, how):
    limits = Limits(rich_outputs=4, rich_bytes=100_000, timeout_s=120)
    with DockerSandbox(limits=limits, runtime=runtime) as box:
        ex = box.run(BYPASS[how] + "for i in range(10): send({'text/plain': f'small {i}'})")
        assert ex.ok, render(ex)
        assert [r.data["text/plain"] for r in ex.results] == [f"small {i}" for i in range(4)]
        assert ex.rich_dropped == 6
        assert ex.rich_dropped_bytes == sum(size(f"small {i}") for i in range(4, 10))
        observation_names(ex)
        # by bytes: two fit; one over the cap is read and dropped; 15 MiB ones are dropped
        # before they are unpacked (counted by their size on the wire: a little more)
        ex = box.run(
            BYPASS[how] + "for n in (40_000, 40_000, 40_000, 15 << 20, 15 << 20, 100):\n"
            "    send({'text/plain': 'x' * n})"
        )
        assert ex.ok, render(ex)
        assert [len(r.data["text/plain"]) for r in ex.results] == [40_000, 40_000, 100]
        assert ex.rich_dropped == 3
        exact = size("x" * 40_000) + 2 * size("x" * (15 << 20))
        assert exact <= ex.rich_dropped_bytes <= exact + 3 * 4096
        observation_names(ex)


# -- the marker -------------------------------------------------------------------------------
@docker_test
@pytest.mark.timeout(120)
def test_a_rich_marker_printed_by_model_code_is_ignored(runtime):
    forged = boundary.rich_marker(99, 123456)
    with DockerSandbox(limits=Limits(rich_outputs=2), runtime=runtime) as box:
        ex = box.run(f"import sys\nprint({forged!r})\nsys.stderr.write({forged!r})\nprint('ok')")
        assert ex.ok and ex.stdout.strip() == "ok", render(ex)
        assert ex.rich_dropped == ex.rich_dropped_bytes == 0 and "dropped" not in render(ex)
        ex = box.run(  # beside real drops: the kernel's count stands
            "from IPython.display import display\n"
            "for i in range(5): display({'text/plain': str(i)}, raw=True)\n"
            f"print({forged!r}, end='')"
        )
        assert ex.rich_dropped == 3 and ex.rich_dropped_bytes == 3 * size("0"), render(ex)


def test_the_collector_takes_the_last_rich_marker_and_ignores_bad_ones():
    collector = Collector("code", cap=1000)
    for text in [
        boundary.rich_marker(99, 5),  # printed by model code: replaced by the kernel's below
        "\n\x1b[sandcell-rich 1 2 3]\n",  # not one the kernel writes
        "\n\x1b[sandcell-rich -1 x]\n",
        "text" + boundary.rich_marker(2, 30),
    ]:
        collector.add({"msg_type": "stream", "content": {"name": "stdout", "text": text}})
    ex = collector.finish(0.1)
    assert (ex.rich_dropped, ex.rich_dropped_bytes) == (2, 30)
    assert "sandcell-rich" not in ex.stdout and "text" in ex.stdout


def test_older_traces_without_the_rich_fields_still_load():
    old = Execution(code="1").to_dict()
    del old["rich_dropped"], old["rich_dropped_bytes"]
    ex = Execution.from_dict(old)
    assert ex.rich_dropped == ex.rich_dropped_bytes == 0 and "dropped" not in render(ex)


def test_rich_size_is_bounded_work_for_any_nesting():
    deep: list = []
    for _ in range(100_000):  # deeper than Python's recursion limit
        deep = [deep]
    assert boundary.rich_size(deep) == 100_000
    assert boundary.rich_size({"k": "é"}, None) == 1 + 2  # UTF-8 bytes
    assert boundary.rich_size({"k": b"abc"}) == 1 + 4  # bytes count as their base64


# -- the command line and host memory ---------------------------------------------------------
def sandcell(*args: str) -> subprocess.CompletedProcess:
    return cli_runner.sandcell(*args, timeout=300)


@docker_test
@pytest.mark.timeout(120)
def test_exec_takes_the_rich_caps_as_flags():
    code = "from IPython.display import display\nfor i in range(5): display(i)"
    run = sandcell("exec", "--json", "--max-rich-outputs", "2", "--max-rich-mb", "1", "-c", code)
    assert run.returncode == 0, run.stderr
    ex = Execution.from_dict(json.loads(run.stdout))
    assert len(ex.results) == 2 and ex.rich_dropped == 3  # the JSON carries only what was kept
    run = sandcell("exec", "--max-rich-outputs", "2", "-c", code)
    assert "[3 displayed outputs were dropped (" in run.stdout, run.stdout


def peak_rss_mb(*args: str) -> float:
    """Peak RSS of a `sandcell` process, sampled every 10 ms."""
    child = cli_runner.sandcell_process(*args, stdout=subprocess.DEVNULL)
    process, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            peak = max(peak, process.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.01)
    assert child.wait() == 0, child.stderr.read()[-2000:]
    return peak / 2**20


@docker_test
@pytest.mark.timeout(300)
def test_exec_stays_small_while_a_cell_displays_40_outputs_of_15_mib():
    """Before the caps, 40 displays of 15 MiB grew `sandcell exec` by about 660 MB."""
    flood = "blob = 'x' * (15 << 20)\nfor _ in range(40): send({'text/plain': blob})"
    base = peak_rss_mb("exec", "--memory", "2048", "-c", "1")
    peaks = {}
    for how, setup in [("display", "from IPython.display import display\n")]:
        setup += "def send(data): display(data, raw=True)\n"
        peaks[how] = peak_rss_mb("exec", "--memory", "2048", "-c", setup + flood)
    peaks["publish"] = peak_rss_mb("exec", "--memory", "2048", "-c", BYPASS["publish"] + flood)
    growth = {how: peak - base for how, peak in peaks.items()}
    assert all(g <= 64 for g in growth.values()), growth
