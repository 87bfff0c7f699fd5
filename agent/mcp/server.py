"""The MCP tools over one sandbox per MCP session: a thin map from tool calls onto the
Sandbox seam and the agent's own tools (render, file_metadata, calculator).

FastMCP runs the server's lifespan once per `Server.run`, which is once for stdio and once
per session for streamable HTTP, so the lifespan is where a session's sandbox is opened and
closed (`Cells`). Every blocking sandbox call runs in a worker thread: one session's long
cell must not stall the others' event loop."""

# No `from __future__ import annotations`: FastMCP reads each tool's annotations, and those of
# run_python name a local (the server's timeout cap).
import base64
import itertools
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import anyio
from jsonschema import Draft202012Validator
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import Field

from agent.events import Event, Output
from sandbox import BackgroundSandbox, Inputs, Limits, Sandbox
from sandbox.boundary import INTERNAL
from sandbox.execution import StreamChunk
from sandbox.render import render
from tools import Registry, calculator_tool, file_metadata_tool
from tools.paths import INPUT_ROOT, WORKSPACE_ROOT, parse_request
from tools.registry import ToolError as SandcellToolError
from tools.registry import schema_problem

READ_DEFAULT, READ_MAX = 64 << 10, 1 << 20  # read_file: bytes by default, and at most
MAX_IMAGES = 8  # figures sent as image content per call; the rest are named, not sent

INSTRUCTIONS = (
    "A sealed, offline Python sandbox (pandas, numpy, matplotlib, ...). Input files are "
    "read-only under /data; write results to /workspace/output and call export_outputs."
)


@dataclass
class Cell:
    """One MCP session's sandbox and the agent tools bound to it."""

    sandbox: Sandbox
    registry: Registry
    output: Path | None  # where export_outputs copies /workspace/output, if anywhere
    lock: threading.Lock = field(default_factory=threading.Lock)  # one cell at a time


class Cells:
    """Opens a sandbox per MCP session (`start` makes it: a DockerSandbox, or one from a warm
    pool) and closes it when the session ends; `close_all` is the backstop at shutdown."""

    def __init__(
        self,
        start: Callable[[], Sandbox],
        limits: Limits,
        inputs: Inputs,
        output: Path | None,
        per_session_output: bool,
    ):
        self.start, self.limits, self.inputs = start, limits, inputs
        self.output, self.per_session_output = output, per_session_output
        self._open: set[BackgroundSandbox] = set()
        self._lock = threading.Lock()

    def open(self) -> Cell:
        sandbox = BackgroundSandbox(self.start, self.limits, self.inputs)  # begun now, not awaited
        with self._lock:
            self._open.add(sandbox)
        registry = Registry([calculator_tool, file_metadata_tool(self.inputs, sandbox)])
        output = self.output
        if output is not None and self.per_session_output:  # HTTP: sessions never mix files
            output = output / uuid.uuid4().hex[:12]
        return Cell(sandbox, registry, output)

    def close(self, cell: Cell) -> None:
        with self._lock:
            self._open.discard(cell.sandbox)
        cell.sandbox.close()

    def close_all(self) -> None:
        with self._lock:
            sandboxes, self._open = list(self._open), set()
        for sandbox in sandboxes:
            sandbox.close()


async def blocking(function: Callable, *args, cancelled: Callable[[], None] | None = None):
    """Run a blocking call in a thread; a cancelled request (the client gave up) calls
    `cancelled`, e.g. to interrupt the cell, instead of leaving it running unseen."""
    try:
        return await anyio.to_thread.run_sync(function, *args, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        if cancelled is not None:
            cancelled()
        raise


def observation(execution, chars: int) -> CallToolResult:
    """The bounded observation as text, each figure as PNG image content; isError when the
    code raised, timed out or the kernel restarted (the text says which)."""
    text = render(execution, chars)
    pngs = [r.data["image/png"] for r in execution.results if r.data.get("image/png")]
    if len(pngs) > MAX_IMAGES:  # a loop of plt.show() must not flood the client's context
        text += (
            f"\n[{len(pngs) - MAX_IMAGES} more figure(s) not sent; every figure is saved "
            "under /workspace/figures (list_files, read_file)]"
        )
    content: list = [TextContent(type="text", text=text)]
    for png in pngs[:MAX_IMAGES]:
        content.append(ImageContent(type="image", data=png.strip(), mimeType="image/png"))
    return CallToolResult(content=content, isError=not execution.ok)


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


def sandbox_path(path: str, cell: Cell, writable: bool = False) -> str:
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


def build_server(cells: Cells, limits: Limits) -> FastMCP:
    @asynccontextmanager
    async def lifespan(_server: FastMCP) -> AsyncIterator[Cell]:
        cell = cells.open()
        try:
            yield cell
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled session still removes it
                await anyio.to_thread.run_sync(cells.close, cell)

    mcp = FastMCP("sandcell", instructions=INSTRUCTIONS, lifespan=lifespan, log_level="WARNING")

    def cell_of(ctx: Context) -> Cell:
        return ctx.request_context.lifespan_context

    async def agent_tool(ctx: Context, name: str, args: dict) -> CallToolResult:
        obs = await blocking(cell_of(ctx).registry.call, name, args)
        return CallToolResult(content=[TextContent(type="text", text=obs.text)], isError=not obs.ok)

    @mcp.tool()
    async def run_python(
        code: Annotated[str, Field(description="Python source for one cell")],
        ctx: Context,
        timeout_s: Annotated[
            float | None,
            Field(gt=0, le=limits.timeout_s, description="deadline of this cell in seconds"),
        ] = None,
    ) -> CallToolResult:
        """Run Python in a stateful Jupyter kernel inside a sealed, offline container
        (variables persist between calls; pandas, numpy, matplotlib). Inputs are read-only in
        /data; write files to /workspace/output. Use for loading, cleaning, statistics and
        charts (each figure comes back as an image); not for plain arithmetic (calculator)."""
        cell = cell_of(ctx)
        running, given_up = threading.Event(), threading.Event()
        progress = progress_of(ctx)

        def run():
            with cell.lock:
                if given_up.is_set():  # cancelled while it waited for another call's cell
                    return None
                running.set()
                return cell.sandbox.run(code, timeout_s, on_output=progress)

        def cancel() -> None:
            given_up.set()
            if running.is_set():  # only its own cell: a queued call interrupts nothing
                cell.sandbox.interrupt()

        execution = await blocking(run, cancelled=cancel)
        return observation(execution, limits.observation_chars)

    @mcp.tool()
    async def describe_file(
        path: Annotated[str, Field(description="/data/<name> or a /workspace path")],
        ctx: Context,
    ) -> CallToolResult:
        """Profile one file without loading it: type, size, encoding, delimiter, rows, column
        types, nulls, first rows. Use before run_python on a file whose layout you do not
        know; not for statistics (run_python)."""
        return await agent_tool(ctx, "file_metadata", {"path": path})

    @mcp.tool()
    async def calculator(
        expression: Annotated[str, Field(description="e.g. '(1,234.5 * 3) ^ 2 / 7'")],
        ctx: Context,
    ) -> CallToolResult:
        """Exact arithmetic on one expression, e.g. 'sqrt(2) * pi'. Not for data in files,
        dates or statistics: use run_python."""
        return await agent_tool(ctx, "calculator", {"expression": expression})

    @mcp.tool()
    async def list_files(ctx: Context) -> dict[str, Any]:
        """List the input files (read-only, /data) and the files in /workspace, with sizes.
        Use to see what the code wrote or what is there to read."""
        cell = cell_of(ctx)
        inputs = [
            {"path": item.sandbox_path, "size": item.size, "read_only": True}
            for item in cell.sandbox.inputs
        ]
        workspace = await blocking(cell.sandbox.files)
        listed = [{"path": f"/workspace/{f['path']}", "size": f.get("size")} for f in workspace]
        return {"files": inputs + listed}

    @mcp.tool()
    async def read_file(
        path: Annotated[str, Field(description="/data/<name> or a /workspace path")],
        ctx: Context,
        max_bytes: Annotated[int, Field(gt=0, le=READ_MAX)] = READ_DEFAULT,
    ) -> dict[str, Any]:
        """Read a file from /data or /workspace: UTF-8 text as it is, anything else as base64;
        at most max_bytes (truncated says whether more was there). For small files and
        results; profile big data files with describe_file or load them in run_python."""
        cell = cell_of(ctx)
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

    @mcp.tool()
    async def write_file(
        path: Annotated[str, Field(description="a path under /workspace (relative ones too)")],
        content: Annotated[str, Field(description="the text to write (UTF-8)")],
        ctx: Context,
    ) -> str:
        """Write a text file into /workspace (a script, a lookup table, parameters) for
        run_python to use. /data is read-only."""
        cell = cell_of(ctx)
        where = sandbox_path(path, cell, writable=True)
        data = content.encode("utf-8")
        await blocking(cell.sandbox.write, where, data)
        return f"wrote {len(data)} bytes to {where}"

    @mcp.tool()
    async def export_outputs(ctx: Context) -> dict[str, Any]:
        """Copy /workspace/output to the folder the server was started with (--output) and
        return the host paths. Call once the results are written there."""
        cell = cell_of(ctx)
        if cell.output is None:
            raise ToolError(
                "this server has no output folder; start `sandcell mcp` with --output DIR"
            )
        cell.output.mkdir(parents=True, exist_ok=True)
        names = await blocking(cell.sandbox.export, cell.output, "output")
        return {"files": [str(cell.output / name) for name in names]}

    # Every call is checked against its tool's schema first, as the agent's registry checks
    # its tools (errors in words); the schemas forbid unknown arguments, which FastMCP alone
    # would drop silently. Validators are built once: the SDK's own check (jsonschema.validate)
    # re-checks the schema on each call, 2 ms, as long as a whole trivial cell.
    validators = {}
    for tool in mcp._tool_manager.list_tools():
        tool.parameters["additionalProperties"] = False
        validators[tool.name] = Draft202012Validator(tool.parameters)

    async def checked_call(name: str, arguments: dict[str, Any]):
        validator = validators.get(name)
        problem = validator and schema_problem(validator, arguments or {})
        if problem:  # the low-level server answers isError with this text
            raise ToolError(f"{name}: {problem}")
        return await mcp.call_tool(name, arguments)

    mcp._mcp_server.call_tool(validate_input=False)(checked_call)
    return mcp
