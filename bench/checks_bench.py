"""The cost of a job's declared checks: one check run (the profile of the output's head, then
the fresh `python -I` checker in the sandbox importing pandas and pandera, reading and
validating the file) on a 10,000-row CSV against a three-column schema. Seconds as the host
waits for it; CPU-seconds of the checker process (its imports included)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandera.pandas as pa

from bench.sandbox_bench import summary
from sandcell.agent.output_checks import load_schema, run_checks
from sandcell.sandbox import DockerSandbox

ROWS = 10_000
WRITE = (
    "import os, pandas as pd\nos.makedirs('/workspace/output', exist_ok=True)\n"
    f"pd.DataFrame({{'id': range({ROWS}), 'amount': [i * 0.5 for i in range({ROWS})], "
    f"'region': ['N', 'S'] * ({ROWS} // 2)}}).to_csv('/workspace/output/clean.csv', index=False)"
)


def run(smoke: bool) -> dict:
    schema = pa.DataFrameSchema(
        {
            "id": pa.Column(int, unique=True),
            "amount": pa.Column(float, pa.Check.ge(0)),
            "region": pa.Column(str, pa.Check.isin(["N", "S"])),
        },
        strict=True,
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sales.yaml"
        path.write_text(schema.to_yaml())
        expect = {"output/clean.csv": load_schema(path)}
    seconds, cpu = [], []
    with DockerSandbox() as sandbox:
        assert sandbox.run(WRITE).ok
        for _ in range(3 if smoke else 15):
            verdict = run_checks(sandbox, expect, max_bytes=64 << 20)
            assert verdict.passed, verdict.outputs
            seconds.append(verdict.duration_s)
            cpu.append(verdict.cpu_s)
    return {"rows": ROWS, "seconds": summary(seconds), "cpu_s": summary(cpu)}


def rows(section: dict, row) -> list[str]:
    s = section
    return [
        row(
            f"declared checks per final answer, a {s['rows']:,}-row CSV against a pandera "
            "schema in a fresh `python -I` (median: seconds / checker CPU-seconds)",
            f"{s['seconds']['median']:.2f} s / {s['cpu_s']['median']:.2f} CPU-s",
            "",
            None,
        )
    ]
