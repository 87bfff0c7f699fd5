"""Session start: time from creating a `Session` to the first observation of a one-cell task,
with a model that takes 1.0 s to answer. The session starts its sandbox in the background, so
the container start overlaps the model's first reply; the old order started the sandbox first
and then asked the model. Both over real HTTP to the scripted server, with real sandboxes,
alternated in one run so the machine's load falls on both alike."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from sandcell import Agent, OpenAIModel
from sandcell.agent.events import Event, Observation
from sandcell.sandbox import DockerSandbox, Limits
from tests.scripted_server import ScriptedServer

MODEL_DELAY_S = 1.0
CSV = Path(__file__).resolve().parent.parent / "tests" / "data" / "agent" / "sales.csv"
CELL = "import pandas as pd\nprint(len(pd.read_csv('/data/sales.csv')))"


def first_observation_s(sandbox_first: bool) -> float:
    """Seconds from Session creation (or, the old order, from the sandbox's start, which then
    came first) to the first observation."""
    script = [
        {"delay": MODEL_DELAY_S, "tool_calls": [{"name": "python", "arguments": {"code": CELL}}]},
        "Final Answer: 12 rows.",
    ]
    seen: list[float] = []

    def on_event(event: Event) -> None:
        if isinstance(event, Observation) and not seen:
            seen.append(time.perf_counter())

    with ScriptedServer(script) as server, tempfile.TemporaryDirectory() as folder:
        model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
        agent = Agent(model, protocol="tools", on_event=on_event)
        started = time.perf_counter()
        sandbox = DockerSandbox(Limits(), [CSV]) if sandbox_first else None
        with agent.session([CSV], folder, sandbox) as session:
            result = session.ask("How many rows?")
    assert result.answered and seen, (result.stop_reason, result.detail)
    return seen[0] - started


def run(smoke: bool) -> dict:
    rounds = 2 if smoke else 7
    background, first = [], []
    for _ in range(rounds):  # alternated: a load spike does not fall on one order only
        background.append(first_observation_s(sandbox_first=False))
        first.append(first_observation_s(sandbox_first=True))
    b, f = statistics.median(background), statistics.median(first)
    return {
        "model_delay_s": MODEL_DELAY_S,
        "rounds": rounds,
        "background_s": background,
        "sandbox_first_s": first,
        "median_background_s": b,
        "median_sandbox_first_s": f,
        "ratio": b / f,
    }


def rows(section: dict, row) -> list[str]:
    s = section
    return [
        row(
            f"session creation to first observation, one-cell task, model answering in "
            f"{s['model_delay_s']:g} s: sandbox started in the background vs first "
            f"(median of {s['rounds']})",
            f"{s['ratio']:.2f}× ({s['median_background_s']:.2f} s vs "
            f"{s['median_sandbox_first_s']:.2f} s)",
            "≤ 0.75×",
            s["ratio"] <= 0.75,
        )
    ]
