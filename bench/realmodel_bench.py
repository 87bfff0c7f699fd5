"""Real tokens, not only characters: one fixed task run by sandcell (`react`) against a real
server, llama-cpp-python's with SmolLM2-135M-Instruct (tests/llama_server.py), and per step the
characters sent beside the tokens the server counts, so a prompt change shows in real tokens.

llama-cpp-python streams no usage, so after the run each recorded request is sent once more,
unstreamed and capped at one token: the usage it answers with is the server's own count of the
prompt it builds. A reply's tokens are the server's count of its text (/extras/tokenize/count).
Without the server package (scripts/ensure-llama.sh) the row says so and is skipped."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import httpx

from bench import skipped_without
from bench.tasks import sent_chars
from sandcell import Agent, OpenAIModel, Rules
from tests.llama_server import MODEL, LlamaServer, missing

TASK = "What is the total of the column n in /data/numbers.csv?"


class RecordingModel:
    """The real OpenAIModel, noting what each call sent and got back."""

    def __init__(self, model: OpenAIModel):
        self.model, self.name = model, model.name
        self.calls: list[tuple[dict, object]] = []

    def complete(self, messages: list[dict], tools: list[dict] | None = None, **kw: object):
        reply = self.model.complete(messages, tools, **kw)
        self.calls.append(({"messages": list(messages), "tools": tools}, reply))
        return reply


def counted(url: str, body: dict, reply_text: str) -> tuple[int, int]:
    """The server's prompt tokens for one request, and its count of the reply's tokens."""
    again = {"model": MODEL, "messages": body["messages"], "max_tokens": 1, "temperature": 0}
    prompt = httpx.post(f"{url}/chat/completions", json=again, timeout=300).json()
    root = url.removesuffix("/v1")
    text = httpx.post(f"{root}/extras/tokenize/count", json={"input": reply_text}, timeout=60)
    return prompt["usage"]["prompt_tokens"], text.json()["count"]


@skipped_without(missing, "the real-server row is skipped")
def run(smoke: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-") as folder:
        csv = Path(folder) / "numbers.csv"
        csv.write_text("n\n1\n2\n3\n")
        with LlamaServer(Path(folder) / "server.log") as server:
            model = RecordingModel(OpenAIModel(MODEL, base_url=server.url, api_key="none"))
            rules = Rules(max_steps=2 if smoke else 3, wall_s=180)
            agent = Agent(model, rules=rules, protocol="react")
            result = agent.run(TASK, [csv], Path(folder) / "out")
            steps = []
            for body, reply in model.calls:
                prompt, completion = counted(server.url, body, reply.text)
                steps.append({"chars_sent": sent_chars(body), "prompt_tokens": prompt,
                              "reply_chars": len(reply.text), "completion_tokens": completion,
                              "finish_reason": reply.finish_reason})  # fmt: skip
    return {"task": TASK, "protocol": "react", "model": MODEL, "steps": steps,
            "stop_reason": result.stop_reason}  # fmt: skip


def rows(section: dict, row) -> list[str]:
    what = "real server (llama-cpp-python, SmolLM2-135M-Instruct), one fixed task in `react`"
    if "skipped" in section:
        return [row(what, f"skipped: {section['skipped']}", "", None)]
    steps = section["steps"]
    chars = statistics.median(s["chars_sent"] for s in steps)
    tokens = statistics.median(s["prompt_tokens"] for s in steps)
    return [
        row(f"{what}: per step, characters sent / prompt tokens the server counted "
            f"(median of {len(steps)} steps; {section['stop_reason']})",
            f"{chars:,.0f} / {tokens:,.0f} ({chars / tokens:.1f} characters a token)", "", None)
    ]  # fmt: skip


def details(section: dict) -> str:
    if "skipped" in section:
        return ""
    lines = [
        "### Real server: characters and tokens per step",
        "",
        f"Task: {section['task']} (`{section['protocol']}`, model `{section['model']}`).",
        "",
        "| step | characters sent | prompt tokens | reply characters | reply tokens | finish |",
        "|---|---|---|---|---|---|",
    ]
    for i, s in enumerate(section["steps"], 1):
        lines.append(
            f"| {i} | {s['chars_sent']:,} | {s['prompt_tokens']:,} | {s['reply_chars']:,} | "
            f"{s['completion_tokens']:,} | {s['finish_reason']} |"
        )
    return "\n".join(lines) + "\n"
