"""gVisor's cost: cold start and a trivial cell under runsc beside runc, measured alternately
in this run so machine noise hits both alike. Skipped, with the reason printed, when the
engine has no runsc runtime (`make engine RUNTIME=runsc` registers it)."""

import time

from bench import skipped_without
from bench.sandbox_bench import cold_start_s, summary
from sandcell.sandbox import DockerSandbox
from sandcell.sandbox import container as ctr
from sandcell.sandbox.errors import SandboxUnavailable

RUNTIMES = ("runc", "runsc")


def missing() -> str | None:
    try:
        ctr.check_runtime(ctr.engine(), "runsc")
    except SandboxUnavailable as error:
        return str(error)
    return None


@skipped_without(missing, "the runsc rows are skipped")
def run(smoke: bool) -> dict:
    starts: dict[str, list[float]] = {runtime: [] for runtime in RUNTIMES}
    for _ in range(3 if smoke else 10):
        for runtime in RUNTIMES:
            starts[runtime].append(cold_start_s(runtime))
    cells: dict[str, list[float]] = {runtime: [] for runtime in RUNTIMES}
    with DockerSandbox(runtime="runc") as runc, DockerSandbox(runtime="runsc") as runsc:
        boxes = {"runc": runc, "runsc": runsc}
        for box in boxes.values():
            for _ in range(20):  # warm up
                box.run("1 + 1")
        for _ in range(20 if smoke else 200):
            for runtime, box in boxes.items():
                started = time.perf_counter()
                box.run("1 + 1")
                cells[runtime].append(time.perf_counter() - started)
    result = {
        "cold_start_s": {runtime: summary(starts[runtime]) for runtime in RUNTIMES},
        "cell_s": {runtime: summary(cells[runtime]) for runtime in RUNTIMES},
    }
    for key in ("cold_start_s", "cell_s"):
        result[key]["ratio"] = result[key]["runsc"]["median"] / result[key]["runc"]["median"]
    return result


def rows(r: dict, row) -> list[str]:
    if "skipped" in r:
        return [row("gVisor (runsc) rows", "skipped: the engine has no runsc runtime", "", None)]
    start, cell = r["cold_start_s"], r["cell_s"]
    return [
        row(
            "cold start under gVisor vs runc (median ratio)",
            f"{start['ratio']:.2f}× ({start['runsc']['median']:.2f} s vs "
            f"{start['runc']['median']:.2f} s)",
            "",
            None,
        ),
        row(
            "trivial cell under gVisor vs runc (median ratio)",
            f"{cell['ratio']:.2f}× ({cell['runsc']['median'] * 1000:.1f} ms vs "
            f"{cell['runc']['median'] * 1000:.1f} ms)",
            "",
            None,
        ),
    ]
