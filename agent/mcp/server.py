"""The MCP tools over one sandbox per MCP session: a thin map from tool calls onto the
Sandbox seam and the agent's own tools (render, file_metadata, calculator).

The tools are the SDK's low-level `Server`'s, listed as agent.mcp.definitions defines them
(the agent's own definitions for the tools it shares). The server runs its lifespan once per
`Server.run`, which is once for stdio and once per session for streamable HTTP, so the
lifespan is where a session's sandbox is opened and closed (`SessionSandboxes`). Every blocking sandbox
call runs in a worker thread: one session's long cell must not stall the others' event loop."""

from __future__ import annotations

import base64
import itertools
import json
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, TypeVar, TypeVarTuple

import anyio
from jsonschema import Draft202012Validator
from mcp.server.fastmcp import Context
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent, Tool

from sandcell.agent.events import Event, OnEvent, Output, cell_events, sandbox_started
from sandcell.agent.mcp.definitions import READ_DEFAULT, definitions
from sandcell.sandbox import BackgroundSandbox, Inputs, Limits, Sandbox
from sandcell.sandbox.boundary import INTERNAL
from sandcell.sandbox.execution import Execution, StreamChunk
from sandcell.sandbox.render import render
from sandcell.tools import Registry, calculator_tool, file_metadata_tool
from sandcell.tools.paths import INPUT_ROOT, WORKSPACE_ROOT, parse_request
from sandcell.tools.registry import ToolError as SandcellToolError
from sandcell.tools.registry import schema_problem

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
# a tool's handler: called with the request's Context and the call's arguments
Handler: TypeAlias = Callable[..., Awaitable[CallToolResult | dict[str, Any] | str]]

MAX_IMAGES = 8  # figures sent as image content per call; the rest are named, not sent

INSTRUCTIONS = (
    "A sealed, offline Python sandbox (pandas, numpy, matplotlib, ...). Input files are "
    "read-only under /data; write results to /workspace/output and call export_outputs."
)


@dataclass
class SessionSandbox:
    """One MCP session's sandbox and the agent tools bound to it."""

    sandbox: Sandbox
    registry: Registry
    output: Path | None  # where export_outputs copies /workspace/output, if anywhere
    lock: threading.Lock = field(default_factory=threading.Lock)  # one cell at a time


class SessionSandboxes:
    """Opens a sandbox per MCP session (`start` makes it: a DockerSandbox, or one from a warm
    pool) and closes it when the session ends; `close_all` is the backstop at shutdown."""

    def __init__(
        self,
        start: Callable[[], Sandbox],
        limits: Limits,
        inputs: Inputs,
        output: Path | None,
        per_session_output: bool,
        observe: OnEvent | None = None,  # the server's metrics: starts and cells
    ):
        self.start, self.limits, self.inputs = start, limits, inputs
        self.output, self.per_session_output = output, per_session_output
        self.observe = observe
        self._open: set[BackgroundSandbox] = set()
        self._lock = threading.Lock()

    def open(self) -> SessionSandbox:
        observe = self.observe
        ready = (lambda timing: observe(sandbox_started(timing))) if observe else None
        sandbox = BackgroundSandbox(self.start, self.limits, self.inputs, on_ready=ready)
        with self._lock:
            self._open.add(sandbox)
        registry = Registry([calculator_tool, file_metadata_tool(self.inputs, sandbox)])
        output = self.output
        if output is not None and self.per_session_output:  # HTTP: sessions never mix files
            output = output / uuid.uuid4().hex[:12]
        return SessionSandbox(sandbox, registry, output)

    def close(self, cell: SessionSandbox) -> None:
        with self._lock:
            self._open.discard(cell.sandbox)
        cell.sandbox.close()

    def states(self) -> dict[str, int]:
        """Sessions by their sandbox's state, as `serve` counts them: an MCP session's is
        live until it ends (never paused or released)."""
        with self._lock:
            return {"live": len(self._open), "paused": 0, "released": 0}

    def close_all(self) -> None:
        with self._lock:
            sandboxes, self._open = list(self._open), set()
        for sandbox in sandboxes:
            sandbox.close()


async def blocking(
    function: Callable[[*Ts], T],
    *args: *Ts,
    cancelled: Callable[[], None] | None = None,
) -> T:
    """Run a blocking call in a thread; a cancelled request (the client gave up) calls
    `cancelled`, e.g. to interrupt the cell, instead of leaving it running unseen."""
    try:
        return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        if cancelled is not None:
            cancelled()
        raise


def observation(execution: Execution, chars: int) -> CallToolResult:
    """The bounded observation as text, each figure as PNG image content, the data of each
    chart and table shown as structured content; isError when the code raised, timed out or
    the kernel restarted (the text says which)."""
    text = render(execution, chars)
    pngs = [r.data["image/png"] for r in execution.results if r.data.get("image/png")]
    if len(pngs) > MAX_IMAGES:  # a loop of plt.show() must not flood the client's context
        text += (
            f"\n[{len(pngs) - MAX_IMAGES} more figure(s) not sent; every figure is saved "
            "under /workspace/figures (list_files, read_file)]"
        )
    content: list[ContentBlock] = [TextContent(type="text", text=text)]
    for png in pngs[:MAX_IMAGES]:
        content.append(ImageContent(type="image", data=png.strip(), mimeType="image/png"))
    data = {  # at most as many as the images (each at most boundary.DATA_BYTES)
        "charts": [r.chart for r in execution.results if r.chart is not None][:MAX_IMAGES],
        "tables": [r.table for r in execution.results if r.table is not None][:MAX_IMAGES],
    }
    return CallToolResult(content=content, structuredContent=data, isError=not execution.ok)


def progress_of(ctx: Context) -> Callable[[StreamChunk], None] | None:
    """MCP progress as a subscriber of agent.events: a running cell's output (Output events)
    reaches a client that asked for progress (a progressToken) as it comes, one notification
    a chunk. None when the client did not ask: the cell then streams to no one. Called in
    the cell's worker thread (blocking(...)), so it waits for each notification to go out."""
    meta = ctx.request_context.meta
    if meta is None or meta.progressToken is None:
        return None
    sent = itertools.count(1)

    def report(event: Event) -> None:
        match event:
            case Output(text=text):
                anyio.from_thread.run(ctx.report_progress, next(sent), None, text)

    return lambda chunk: report(Output(name=chunk.name, text=chunk.text))


def sandbox_path(path: str, cell: SessionSandbox, writable: bool = False) -> str:
    """A path under /data (read only) or /workspace, parsed as file_metadata parses it."""
    try:
        target = parse_request(path, cell.sandbox.inputs.names)
    except SandcellToolError as error:
        raise ToolError(str(error)) from None
    if target.area == WORKSPACE_ROOT and target.parts[:1] == (INTERNAL,):
        raise ToolError(f"{target.shown} is sandcell's own folder; use another path")
    if writable and target.area != WORKSPACE_ROOT:
        raise ToolError(f"{target.shown}: the inputs are read-only; write under /workspace")
    if target.area == INPUT_ROOT and not target.parts:
        raise ToolError("/data is a folder; name a file in it (list_files shows them)")
    return target.shown


class ToolHandlers:
    """The server's seven tools, each a method called with the MCP request's Context (whose
    lifespan context is the session's SessionSandbox); what a client is told about each tool
    is in agent.mcp.definitions."""

    def __init__(self, limits: Limits, observe: OnEvent | None = None):
        self.limits, self.observe = limits, observe

    def by_name(self) -> dict[str, Handler]:
        return {
            "run_python": self.run_python,
            "describe_file": self.describe_file,
            "calculator": self.calculator,
            "list_files": self.list_files,
            "read_file": self.read_file,
            "write_file": self.write_file,
            "export_outputs": self.export_outputs,
        }

    async def agent_tool(self, ctx: Context, name: str, args: dict) -> CallToolResult:
        outcome = await blocking(session_of(ctx).registry.call, name, args)
        return CallToolResult(
            content=[TextContent(type="text", text=outcome.text)], isError=not outcome.ok
        )

    async def run_python(
        self, code: str, ctx: Context, timeout_s: float | None = None
    ) -> CallToolResult:
        cell, observe = session_of(ctx), self.observe
        running, given_up = threading.Event(), threading.Event()
        progress = progress_of(ctx)

        def run() -> Execution | None:
            with cell.lock:
                if given_up.is_set():  # cancelled while it waited for another call's cell
                    return None
                running.set()
                execution = cell.sandbox.run(code, timeout_s, on_output=progress)
                if observe is not None:  # as /execute's cells: a step, no model (a cell
                    for event in cell_events(0, code, execution):  # its client gave up too)
                        observe(event)
            return execution

        def cancel() -> None:
            given_up.set()
            if running.is_set():  # only its own cell: a queued call interrupts nothing
                cell.sandbox.interrupt()

        execution = await blocking(run, cancelled=cancel)
        assert execution is not None  # None only for a call given up, whose await raised
        return observation(execution, self.limits.observation_chars)

    async def describe_file(self, path: str, ctx: Context) -> CallToolResult:
        return await self.agent_tool(ctx, "file_metadata", {"path": path})

    async def calculator(self, expression: str, ctx: Context) -> CallToolResult:
        return await self.agent_tool(ctx, "calculator", {"expression": expression})

    async def list_files(self, ctx: Context) -> dict[str, Any]:
        cell = session_of(ctx)
        inputs = [
            {"path": item.sandbox_path, "size": item.size, "read_only": True}
            for item in cell.sandbox.inputs
        ]
        workspace = await blocking(cell.sandbox.files)
        listed = [{"path": f"/workspace/{f['path']}", "size": f.get("size")} for f in workspace]
        return {"files": inputs + listed}

    async def read_file(
        self, path: str, ctx: Context, max_bytes: int = READ_DEFAULT
    ) -> dict[str, Any]:
        max_bytes = int(max_bytes)  # JSON Schema counts 6.0 as an integer
        cell = session_of(ctx)
        where = sandbox_path(path, cell)
        data = await blocking(cell.sandbox.read, where, max_bytes + 1)
        truncated, data = len(data) > max_bytes, data[:max_bytes]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            if not (truncated and error.start >= len(data) - 3):  # not just a cut character
                return {
                    "path": where,
                    "encoding": "base64",
                    "content": base64.b64encode(data).decode(),
                    "truncated": truncated,
                }
            text = data[: error.start].decode("utf-8")
        return {"path": where, "encoding": "utf-8", "content": text, "truncated": truncated}

    async def write_file(self, path: str, content: str, ctx: Context) -> str:
        cell = session_of(ctx)
        where = sandbox_path(path, cell, writable=True)
        data = content.encode("utf-8")
        await blocking(cell.sandbox.write, where, data)
        return f"wrote {len(data)} bytes to {where}"

    async def export_outputs(self, ctx: Context) -> dict[str, Any]:
        cell = session_of(ctx)
        if cell.output is None:
            raise ToolError(
                "this server has no output folder; start `sandcell mcp` with --output DIR"
            )
        cell.output.mkdir(parents=True, exist_ok=True)
        names = await blocking(cell.sandbox.export, cell.output, "output")
        return {"files": [str(cell.output / name) for name in names]}


def session_of(ctx: Context) -> SessionSandbox:
    return ctx.request_context.lifespan_context


def build_server(cells: SessionSandboxes, limits: Limits) -> Server:
    @asynccontextmanager
    async def lifespan(_server: Server) -> AsyncIterator[SessionSandbox]:
        cell = cells.open()
        try:
            yield cell
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled session still removes it
                await anyio.to_thread.run_sync(cells.close, cell)

    server = Server("sandcell", instructions=INSTRUCTIONS, lifespan=lifespan)
    handlers = ToolHandlers(limits, cells.observe).by_name()
    listed = definitions(limits)
    if {tool.name for tool in listed} != set(handlers):  # a tool defined but not served
        raise RuntimeError("agent.mcp.definitions and the server's handlers name other tools")
    # Every call is checked against its tool's schema first, as the agent's registry checks
    # its tools (errors in words; unknown arguments refused). Validators are built once: the
    # SDK's own check (jsonschema.validate) re-checks the schema on each call, 2 ms, as long
    # as a whole trivial cell.
    validators = {tool.name: Draft202012Validator(tool.inputSchema) for tool in listed}

    @server.list_tools()
    async def list_tools() -> list[Tool]:
        return listed

    @server.call_tool(validate_input=False)
    async def call_tool(
        name: str, arguments: dict[str, Any]
    ) -> tuple[list[TextContent], dict[str, Any]] | CallToolResult:
        handler = handlers.get(name)
        if handler is None:  # the low-level server answers isError with this text
            raise ToolError(f"Unknown tool: {name}")
        problem = schema_problem(validators[name], arguments)
        if problem:
            raise ToolError(f"{name}: {problem}")
        try:
            result = await handler(ctx=Context(request_context=server.request_context), **arguments)
        except Exception as error:  # an isError result that names the tool, as FastMCP's did
            raise ToolError(f"Error executing tool {name}: {error}") from error
        if isinstance(result, str):  # write_file's one line, also as {"result": line}
            return [TextContent(type="text", text=result)], {"result": result}
        if isinstance(result, dict):  # an object: structured, and as JSON text for older clients
            text = json.dumps(result, indent=2, ensure_ascii=False)
            return [TextContent(type="text", text=text)], result
        return result

    return server


def run_stdio(server: Server) -> None:
    """Serve the one client on stdin/stdout until it closes the pipe."""

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
