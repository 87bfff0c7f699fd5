"""Big inputs: a file larger than about half the sandbox's memory is named in the first prompt
with advice on reading it (chunks, DuckDB or Polars lazily), and an out-of-memory restart's
observation names the memory limit, the flag that raises it and the same advice. End to end: a
generated CSV larger than the sandbox's memory (--memory 256), the real `sandcell run`, the real
kernel, a scripted model that loads it whole first."""

import json
import re
from pathlib import Path

import pytest

from sandcell.agent import prompts
from sandcell.sandbox import render
from sandcell.sandbox.execution import Execution
from sandcell.sandbox.inputs import Inputs
from sandcell.sandbox.render import MEMORY_ADVICE
from tests.cli_runner import sandcell
from tests.scripted_server import ScriptedServer

MEMORY_MB = 256


def write_csv(path: Path, size: int) -> int:
    """A CSV of about `size` bytes (text columns: pandas holds them as Python strings); its
    number of rows."""
    header = "id,name,city,note\n"
    rows = [f"{i},customer-{i:06d},city-{i % 97:03d},note-{i:08d}-abcdefghij\n" for i in range(20_000)]  # fmt: skip
    block = "".join(rows).encode()
    n = max(1, (size - len(header)) // len(block) + 1)
    with path.open("wb") as f:
        f.write(header.encode())
        for _ in range(n):
            f.write(block)
    return n * len(rows)


def small_csv(path: Path, size: int) -> Path:
    path.write_bytes(b"a,b\n" + b"1,2\n" * (size // 4))
    return path


def test_first_prompt_advises_on_an_input_larger_than_half_the_memory(tmp_path):
    small = small_csv(tmp_path / "small.csv", 10_000)
    big = small_csv(tmp_path / "big.csv", 600_000)
    text = prompts.inputs_profile(Inputs.from_paths([small, big]), memory_mb=1)
    assert "Too big to load whole: /data/big.csv (" in text and "/data/small.csv (" not in text
    assert "1 MB of sandbox memory" in text and MEMORY_ADVICE in text
    # none when each, and all together, fit in half the memory
    assert "Too big" not in prompts.inputs_profile(Inputs.from_paths([small, big]), 2)
    assert "Too big" not in prompts.inputs_profile(Inputs.from_paths([big]), None)
    # each small enough, together too big
    halves = [small_csv(tmp_path / f"{n}.csv", 700_000) for n in "ab"]
    text = prompts.inputs_profile(Inputs.from_paths(halves), memory_mb=2)
    assert "Too big to load whole: the inputs together (" in text


def test_out_of_memory_restart_names_the_limit_the_flag_and_the_advice():
    text = render(Execution(restarted="out of memory"), memory_mb=MEMORY_MB)
    assert f"{MEMORY_MB} MB" in text and "--memory" in text and MEMORY_ADVICE in text
    assert "DuckDB" not in render(Execution(restarted="timeout"), memory_mb=MEMORY_MB)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_csv_larger_than_the_sandbox_memory_ends_with_an_answer(tmp_path):
    data = tmp_path / "big.csv"
    rows = write_csv(data, (MEMORY_MB + 8) << 20)
    assert data.stat().st_size > MEMORY_MB << 20
    seen: dict[str, str] = {}

    def load_whole(body: dict) -> dict:
        seen["system"] = body["messages"][0]["content"]
        code = "import pandas as pd\ndf = pd.read_csv('/data/big.csv')\nprint(len(df))"
        return {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}

    def in_chunks(body: dict) -> dict:
        seen["restart"] = body["messages"][-1]["content"]
        code = (
            "import pandas as pd\n"
            "print(sum(len(c) for c in pd.read_csv('/data/big.csv', usecols=['id'], "
            "chunksize=500_000)))"
        )
        return {"tool_calls": [{"name": "python", "arguments": {"code": code}}]}

    def answer(body: dict) -> str:
        return f"The file has {body['messages'][-1]['content'].strip()} rows."

    with ScriptedServer([load_whole, in_chunks, answer]) as server:
        done = sandcell(
            "run", "--task", "How many rows?", "--input", str(data), "--memory", str(MEMORY_MB),
            "--base-url", server.url, "--api-key", "k", "--model", "m", "--protocol", "tools",
            "--output", str(tmp_path / "out"), "--vision", "off",
            timeout=280,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Too big to load whole: /data/big.csv" in seen["system"]
    assert f"{MEMORY_MB} MB of sandbox memory" in seen["system"] and "DuckDB" in seen["system"]
    restart = seen["restart"]
    assert "ran out of memory (the sandbox has 256 MB;" in restart, restart
    assert "--memory" in restart and "DuckDB" in restart
    assert f"The file has {rows} rows." in done.stdout
    final = [json.loads(line) for line in (tmp_path / "out" / "trace.jsonl").open()][-1]
    assert final["type"] == "final" and final["stop_reason"] == "answered"
    assert re.search(r"\d+ rows", final["answer"])
