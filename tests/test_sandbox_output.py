"""What comes back from a cell beyond plain values: charts whatever backend the code picks."""

import pytest

from sandbox import DockerSandbox, Limits, boundary, render

docker_test = pytest.mark.docker
SLOW = Limits(timeout_s=120, interrupt_grace_s=2)
PNG = b"\x89PNG\r\n\x1a\n"


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
@pytest.mark.timeout(60)
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
