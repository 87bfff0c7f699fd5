"""MCP round trip: a trivial `run_python` call through `sandcell mcp` over stdio, with the
SDK's own client, against `DockerSandbox.run` of the same cell in this process. Both sides
are warmed up, then interleaved, so the machine's load falls on both alike; the figure is
the ratio of the medians (what the protocol, the pipes and the server's thread hop add)."""

from __future__ import annotations

import os
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.sandbox_bench import summary
from sandcell.sandbox import DockerSandbox
from tests.cli_runner import SANDCELL

CELL = "1 + 1"
WARMUP = 20


async def _measure(runs: int) -> tuple[list[float], list[float]]:
    server = StdioServerParameters(
        command=SANDCELL[0], args=[*SANDCELL[1:], "mcp"], env=dict(os.environ)
    )
    ours, direct = [], []
    with DockerSandbox() as sandbox:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(WARMUP):
                result = await session.call_tool("run_python", {"code": CELL})
                assert result.content[0].text == "2", result
                sandbox.run(CELL)
            for _ in range(runs):
                started = time.perf_counter()
                await session.call_tool("run_python", {"code": CELL})
                ours.append(time.perf_counter() - started)
                started = time.perf_counter()
                sandbox.run(CELL)
                direct.append(time.perf_counter() - started)
    return ours, direct


def run(smoke: bool) -> dict:
    ours, direct = anyio.run(_measure, 20 if smoke else 200)
    result = {"mcp_stdio": summary(ours), "docker_sandbox_run": summary(direct)}
    result["ratio"] = result["mcp_stdio"]["median"] / result["docker_sandbox_run"]["median"]
    return result


def rows(section: dict, row) -> list[str]:
    s = section
    return [
        row(
            "trivial run_python through stdio MCP vs in-process DockerSandbox.run (median ratio)",
            f"{s['ratio']:.2f}× ({s['mcp_stdio']['median'] * 1000:.1f} ms vs "
            f"{s['docker_sandbox_run']['median'] * 1000:.1f} ms)",
            "≤ 1.5×",
            s["ratio"] <= 1.5,
        )
    ]
