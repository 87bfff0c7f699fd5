"""The MCP SDK's own client against `sandcell mcp` (tests/test_mcp.py, test_charts.py, and
`mcp --http --ray` in test_serve_ray.py): a session over stdio or streamable HTTP, a cell, a
result's text."""

import os
import re
import subprocess
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.cli_runner import SANDCELL, sandcell_process
from tests.serve_helpers import ALICE, BOB


def text(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


async def python(session: ClientSession, code: str, **extra):
    return await session.call_tool("run_python", {"code": code, **extra})


def start_http(tmp_path, *extra: str) -> tuple[subprocess.Popen, str]:
    users = tmp_path / "users.txt"
    users.write_text(f"alice:{ALICE}\nbob:{BOB}\n")
    proc = sandcell_process(
        "mcp", "--http", "--port", "0", "--users", str(users), "--pool", "1", *extra
    )
    first = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/mcp", first)
    assert found, first + proc.stderr.read()
    return proc, found.group(0)


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def http_session(url: str, token: str, end: bool = True):
    """`end=False`: the client goes away without ending its session (no DELETE)."""
    async with (
        httpx.AsyncClient(headers=bearer(token), timeout=httpx.Timeout(30, read=300)) as http,
        streamable_http_client(url, http_client=http, terminate_on_close=end) as (
            read,
            write,
            session_id,
        ),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session, session_id()


T = TypeVar("T")


@asynccontextmanager
async def stdio(*args: str):
    """A ClientSession over stdio with `sandcell mcp ARGS` as the server process."""
    server = StdioServerParameters(command=SANDCELL[0], args=[*SANDCELL[1:], "mcp", *args])
    server.env = dict(os.environ)  # the SDK passes a bare environment otherwise
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def over_stdio(scenario: Callable[[ClientSession], Awaitable[T]], *args: str) -> T:
    """scenario(session) run against `sandcell mcp ARGS` over stdio: what it returns."""

    async def main() -> T:
        async with stdio(*args) as session:
            return await scenario(session)

    return anyio.run(main)
