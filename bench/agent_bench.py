"""Agent figures: the loop's own cost per step (no model, no sandbox), and the characters sent
to the model per task, sandcell against smolagents' CodeAgent fed the same scripted actions.

Both agents talk over real HTTP (the `openai` client) to the scripted OpenAI-compatible server
of the tests, which records every request body; the characters are counted from those bodies
the same way for both (bench.tasks.sent_chars). sandcell runs its code in the Docker sandbox
(/data/<name>); smolagents runs it with its local executor on a host copy of the same CSV."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shutil
import statistics
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from bench.tasks import TASKS, Task, sandcell_script, sent_chars, smolagents_script
from sandcell import Agent, OpenAIModel, Rules, ScriptedModel
from sandcell.agent.events import Event, OnEvent, fan_out
from sandcell.agent.loop import Loop
from sandcell.agent.records.trace import TraceWriter
from sandcell.agent.vision import IMAGE_TOKENS
from sandcell.tools import Registry, calculator_tool
from tests.scripted_server import ScriptedServer, image_parts

SMOLAGENTS_IMPORTS = ["pandas", "numpy"]


# -- loop overhead ---------------------------------------------------------------------------


class TimedModel:
    """A ScriptedModel that notes when each call starts and ends: the time between the end of
    one call and the start of the next is the loop's own work for that step."""

    def __init__(self, model: ScriptedModel):
        self.model, self.name = model, model.name
        self.spans: list[tuple[float, float]] = []

    def complete(self, messages: list[dict], tools: list[dict] | None = None, **kw: object):
        started = time.perf_counter()
        reply = self.model.complete(messages, tools, **kw)
        self.spans.append((started, time.perf_counter()))
        return reply


class TimedTrace(TraceWriter):
    """The real trace writer (flush and fsync per event), timing each write."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.spans: list[float] = []

    def write(self, event: Event) -> None:
        started = time.perf_counter()
        super().write(event)
        self.spans.append(time.perf_counter() - started)


def step_overhead(steps: int, protocol: str, spans: OnEvent | None = None) -> dict:
    """Median time of one loop step around an instant tool (calculator) and an instant model:
    context fit, parse, schema check, tool call, observation, stop rules, trace (fsync);
    `spans`: OpenTelemetry's span writer beside the trace (agent/telemetry.py)."""
    replies: list = [
        {"content": f"Step {i}: add the next number.",
         "tool_calls": [{"name": "calculator", "arguments": {"expression": f"{i} + 1"}}]}
        for i in range(steps)
    ]  # fmt: skip
    replies.append("Final Answer: the sum is done.")
    model = TimedModel(ScriptedModel(replies))
    rules = Rules(max_steps=steps + 5, token_budget=10**9)
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-") as folder:
        trace = TimedTrace(Path(folder) / "trace.jsonl")
        try:
            publish = fan_out(trace, spans)
            loop = Loop(model, Registry([calculator_tool]), publish, protocol=protocol, rules=rules)
            result = loop.ask("Add the numbers one by one.")
        finally:
            trace.close()
    assert result.answered and result.steps == steps + 1, (result.stop_reason, result.detail)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(model.spans)]
    return {"median_s": statistics.median(gaps), "max_s": max(gaps), "steps": len(gaps),
            "trace_write_median_s": statistics.median(trace.spans)}  # fmt: skip


# -- characters sent per task ----------------------------------------------------------------


def run_sandcell(task: Task, protocol: str) -> dict:
    """One task with sandcell over HTTP; the characters sent and the protocol actually used."""
    with ScriptedServer(sandcell_script(task, protocol)) as server:
        model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
        with Agent(model, protocol=protocol).session([task.csv]) as session:
            result = session.ask(task.prompt(f"/data/{task.csv.name}"))
            used = session.loop.protocol.name
        left, requests = server.left(), list(server.requests)
    assert result.answer == task.expected(), (task.id, protocol, result.answer, result.detail)
    assert left == 0, f"{task.id}: {left} scripted replies unused"
    return {**_sent(requests), "protocol": used}


def run_smolagents(task: Task, folder: Path) -> dict:
    """The same task with smolagents' CodeAgent and its OpenAI-compatible model client."""
    from smolagents import CodeAgent, LogLevel, OpenAIServerModel

    path = folder / task.csv.name
    if not path.exists():
        shutil.copy(task.csv, path)
    with ScriptedServer(smolagents_script(task, str(path))) as server:
        model = OpenAIServerModel("scripted", api_base=server.url, api_key="k")
        agent = CodeAgent(tools=[], model=model, additional_authorized_imports=SMOLAGENTS_IMPORTS,
                          verbosity_level=LogLevel.OFF)  # fmt: skip
        answer = agent.run(task.prompt(str(path)))
        left, requests = server.left(), list(server.requests)
    assert answer == task.expected(), (task.id, "smolagents", answer)
    assert left == 0, f"{task.id}: {left} scripted replies unused by smolagents"
    return _sent(requests)


def _sent(requests: list[dict]) -> dict:
    """What the model was sent over one task: characters, requests, the first one's size."""
    return {"chars": sum(map(sent_chars, requests)), "requests": len(requests),
            "first": sent_chars(requests[0])}  # fmt: skip


def characters(tasks: list[Task]) -> dict:
    logging.getLogger("smolagents").setLevel(logging.WARNING)
    per_task = []
    with tempfile.TemporaryDirectory(prefix="sc") as folder:  # short: the path is in the code
        for task in tasks:
            auto, react = run_sandcell(task, "auto"), run_sandcell(task, "react")
            smol = run_smolagents(task, Path(folder))
            per_task.append({"task": task.id, "steps": len(task.steps) + 1,
                             "sandcell_auto": auto["chars"], "sandcell_react": react["chars"],
                             "smolagents": smol["chars"], "auto_protocol": auto["protocol"],
                             "requests": {"sandcell": auto["requests"],
                                          "smolagents": smol["requests"]},
                             "first_request": {"sandcell_auto": auto["first"],
                                               "smolagents": smol["first"]}})  # fmt: skip
    totals = {
        k: sum(t[k] for t in per_task) for k in ("sandcell_auto", "sandcell_react", "smolagents")
    }
    return {
        "tasks": per_task,
        "auto_protocol": sorted({t["auto_protocol"] for t in per_task}),
        "mean_per_task": {k: v / len(per_task) for k, v in totals.items()},
        "ratio_auto": totals["sandcell_auto"] / totals["smolagents"],
        "ratio_react": totals["sandcell_react"] / totals["smolagents"],
        "smolagents": version("smolagents"),
    }


# -- what --vision costs -----------------------------------------------------------------------

CHART = "import matplotlib.pyplot as plt\nplt.bar(['a', 'b', 'c'], [3, 1, 2])\nplt.show()\n"


def vision_cost() -> dict:
    """One chart task (a chart cell, a print cell, the answer: three requests) with --vision off
    and on: characters of text, image parts, estimated tokens (characters / 4 plus a fixed
    IMAGE_TOKENS an image) and the data URLs' characters on the wire, per request."""
    out = {}
    for mode in ("off", "on"):
        script = [
            {"tool_calls": [{"name": "python", "arguments": {"code": CHART}}]},
            {"tool_calls": [{"name": "python", "arguments": {"code": "print('a is tallest')"}}]},
            "The tallest bar is a.",
        ]
        with ScriptedServer(script) as server:
            model = OpenAIModel("scripted", base_url=server.url, api_key="k", retry_base_s=0.01)
            result = Agent(model, protocol="tools", vision=mode).run("Chart it and say")
            requests = list(server.requests)
        assert result.answered, (mode, result.detail)
        chars = [sent_chars(body) for body in requests]
        images = [image_parts(body) for body in requests]
        urls = [len(json.dumps(body)) - len(json.dumps(_without_urls(body))) for body in requests]
        out[mode] = {"requests": len(requests), "chars": statistics.mean(chars),
                     "images": sum(images), "url_chars": statistics.mean(urls),
                     "tokens": statistics.mean(c / 4 + IMAGE_TOKENS * n
                                               for c, n in zip(chars, images, strict=True))}  # fmt: skip
    return out


def _without_urls(body: dict) -> dict:
    """A request with every data URL emptied: what the images weigh on the wire is the rest."""
    text = json.dumps(body)
    return json.loads(re.sub(r'"data:image/[^"]*"', '""', text))


def traced_steps(steps: int, rounds: int) -> dict:
    """The tools protocol's loop step with traces exported (OTLP/HTTP to a receiver in a
    process of its own, as a collector is) against off, alternated in `rounds`: the medians'
    ratio."""
    from sandcell.agent.telemetry import Spans, flush, the_exporter
    from tests.otlp_receiver import receiving_apart

    with receiving_apart() as (endpoint, received):
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        try:
            exporter = the_exporter()
            assert exporter is not None, "the otel extra is not installed"
            off, on = [], []
            for _ in range(rounds):
                off.append(step_overhead(steps, "tools")["median_s"])
                spans = Spans(exporter, "bench").on_event
                on.append(step_overhead(steps, "tools", spans)["median_s"])
            flush()
        finally:
            del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    off_s, on_s = statistics.median(off), statistics.median(on)
    chats = sum(n for name, n in received.items() if name.startswith("chat "))
    return {"off_s": off_s, "on_s": on_s, "ratio": on_s / off_s, "chat_spans": chats}


def run(smoke: bool) -> dict:
    steps = 30 if smoke else 300
    tasks = TASKS[:3] if smoke else TASKS
    return {
        "step_overhead": {p: step_overhead(steps, p) for p in ("tools", "react")},
        "traced": traced_steps(steps, 3 if smoke else 9),
        "characters": characters(tasks),
        "vision": vision_cost(),
    }


# -- report ----------------------------------------------------------------------------------


def rows(section: dict, row) -> list[str]:
    s, c = section["step_overhead"], section["characters"]
    mean = c["mean_per_task"]
    picked = "/".join(c["auto_protocol"])
    return [
        row(f"one loop step, no model or sandbox time (median of {s['tools']['steps']}; "
            "tools / react; in it, one trace write, flushed; its disk sync runs off the thread)",
            f"{s['tools']['median_s'] * 1000:.2f} ms / {s['react']['median_s'] * 1000:.2f} ms "
            f"({s['tools']['trace_write_median_s'] * 1000:.2f} ms)", "", None),
        row(f"characters sent per task, sandcell `auto` (picked `{picked}`) vs smolagents "
            f"{c['smolagents']} CodeAgent ({len(c['tasks'])} tasks, ratio of totals)",
            f"{c['ratio_auto']:.2f}× ({mean['sandcell_auto']:,.0f} vs "
            f"{mean['smolagents']:,.0f} a task)", "≤ 0.35×", c["ratio_auto"] <= 0.35),
        *_traced_rows(section.get("traced"), row),
        *_vision_rows(section.get("vision"), row),
        row("characters sent per task, sandcell `react` vs smolagents CodeAgent",
            f"{c['ratio_react']:.2f}× ({mean['sandcell_react']:,.0f} vs "
            f"{mean['smolagents']:,.0f} a task)", "≤ 0.35×", c["ratio_react"] <= 0.35),
    ]  # fmt: skip


def _traced_rows(t: dict | None, row) -> list[str]:
    if not t:  # results from before traces
        return []
    return [
        row("one loop step with OpenTelemetry traces exported (OTLP/HTTP to a receiver in a "
            f"process of its own, as a collector is; {t['chat_spans']} chat spans) vs off, "
            "tools protocol, median of alternated rounds",
            f"{t['ratio']:.2f}× ({t['on_s'] * 1000:.2f} ms vs {t['off_s'] * 1000:.2f} ms)",
            "≤ 1.10×", t["ratio"] <= 1.10),
    ]  # fmt: skip


def _vision_rows(v: dict | None, row) -> list[str]:
    if not v:  # results from before --vision
        return []
    off, on = v["off"], v["on"]
    return [
        row(f"per request of a chart task ({on['requests']} requests, {on['images']} image "
            "parts in all), --vision off / on: characters of text, estimated tokens (an image "
            f"counts {IMAGE_TOKENS}), data-URL characters on the wire",
            f"{off['chars']:,.0f} / {on['chars']:,.0f} chars; {off['tokens']:,.0f} / "
            f"{on['tokens']:,.0f} tokens; {on['url_chars']:,.0f} URL chars with images", "",
            None),
    ]  # fmt: skip


def details(section: dict) -> str:
    """The per-task numbers behind the characters ratio."""
    lines = [
        "### Characters sent to the model, per task",
        "",
        "| task | model calls | sandcell auto | sandcell react | smolagents | auto / smolagents |",
        "|---|---|---|---|---|---|",
    ]
    for t in section["characters"]["tasks"]:
        lines.append(
            f"| {t['task']} | {t['steps']} | {t['sandcell_auto']:,} | {t['sandcell_react']:,} | "
            f"{t['smolagents']:,} | {t['sandcell_auto'] / t['smolagents']:.2f} |"
        )
    tasks = section["characters"]["tasks"]
    first = {k: statistics.median(t["first_request"][k] for t in tasks)
             for k in ("sandcell_auto", "smolagents")}  # fmt: skip
    lines += [
        "",
        (
            f"The first request of a task (system prompt, task, tool definitions) is "
            f"{first['sandcell_auto']:,.0f} characters for sandcell `auto` and "
            f"{first['smolagents']:,.0f} for smolagents (medians); every later request of the task "
            "sends it again, so this fixed part sets most of the ratio."
        ),
    ]
    return "\n".join(lines) + "\n"
