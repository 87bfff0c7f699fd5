"""The stream transport's cost beside ipc's (sandbox/transport.py), on the same local engine,
measured alternately in this run so machine noise hits both alike: a trivial cell's round
trip, a cold start, and a 50 MB input reaching a new sandbox (copied into its volume through
the engine's API, against a bind mount of the host's file)."""

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.sandbox_bench import summary
from sandcell.sandbox import DockerSandbox, Limits

TRANSPORTS = ("ipc", "stream")
INPUT_MB = 50


def limits(transport: str) -> Limits:
    return replace(Limits(), transport=transport)


def first_result_s(transport: str, inputs: list[Path] = ()) -> float:
    """Seconds from a new sandbox to its first result (its removal not counted)."""
    started = time.perf_counter()
    with DockerSandbox(limits(transport), inputs=inputs) as sandbox:
        code = f"import os; os.path.getsize('/data/{inputs[0].name}')" if inputs else "1 + 1"
        assert sandbox.run(code).ok
        return time.perf_counter() - started


def run(smoke: bool) -> dict:
    starts: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    with_input: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder, "big.csv")
        with open(data, "wb") as f:
            f.write(os.urandom(INPUT_MB << 20))
        for _ in range(3 if smoke else 10):
            for name in TRANSPORTS:
                starts[name].append(first_result_s(name))
                with_input[name].append(first_result_s(name, [data]))
    cells: dict[str, list[float]] = {name: [] for name in TRANSPORTS}
    with DockerSandbox(limits("ipc")) as ipc, DockerSandbox(limits("stream")) as stream:
        boxes = {"ipc": ipc, "stream": stream}
        for box in boxes.values():
            for _ in range(20):  # warm up
                box.run("1 + 1")
        for _ in range(20 if smoke else 200):
            for name, box in boxes.items():
                started = time.perf_counter()
                box.run("1 + 1")
                cells[name].append(time.perf_counter() - started)
    result = {"input_mb": INPUT_MB}
    for key, samples in (
        ("cell_s", cells),
        ("cold_start_s", starts),
        ("input_start_s", with_input),
    ):
        result[key] = {name: summary(samples[name]) for name in TRANSPORTS}
        result[key]["ratio"] = result[key]["stream"]["median"] / result[key]["ipc"]["median"]
    return result


def rows(r: dict, row) -> list[str]:
    def said(key: str, scale: float, unit: str) -> str:
        ipc, stream = r[key]["ipc"]["median"] * scale, r[key]["stream"]["median"] * scale
        return f"{r[key]['ratio']:.2f}× ({stream:.2f} {unit} vs {ipc:.2f} {unit})"

    cell, start = r["cell_s"]["ratio"], r["cold_start_s"]["ratio"]
    return [
        row("trivial cell, stream transport vs ipc (median ratio)",
            said("cell_s", 1000, "ms"), "≤ 1.5×", cell <= 1.5),
        row("cold start, stream transport vs ipc (median ratio)",
            said("cold_start_s", 1, "s"), "≤ 1.2×", start <= 1.2),
        row(f"a new sandbox with a {r['input_mb']} MB input: copied into its volume (stream) "
            "vs bind-mounted (ipc)", said("input_start_s", 1, "s"), "", None),
    ]  # fmt: skip
