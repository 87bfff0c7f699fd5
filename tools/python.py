"""The python tool: the model's code runs in the sandbox's kernel; the observation is the
sandbox's capped rendering, and the Execution itself rides along for traces and notebooks."""

from __future__ import annotations

from collections.abc import Callable

from sandcell.sandbox.errors import SandboxError
from sandcell.sandbox.execution import StreamChunk
from sandcell.sandbox.protocol import Sandbox
from sandcell.sandbox.render import render
from sandcell.tools.registry import Spec, Tool, ToolOutcome

SPEC = Spec(
    name="python",
    description=(
        "Run Python in a persistent Jupyter kernel (pandas, numpy, matplotlib; no network). "
        "Inputs are read-only in /data; write to /workspace/output. For loading, cleaning, "
        "statistics and charts; not for arithmetic on numbers you already have (calculator)."
    ),
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source for one cell"}},
        "required": ["code"],
        "additionalProperties": False,
    },
)


def python_tool(
    sandbox: Sandbox,
    budget: int | None = None,
    on_output: Callable[[StreamChunk], None] | None = None,
) -> Tool:
    """A Tool running code with `sandbox.run`. `budget` caps the observation in characters
    (default: the sandbox's Limits.observation_chars); `on_output` sees each stdout/stderr
    chunk as the cell prints it (a UI showing a long cell live)."""
    limits = sandbox.limits
    chars = budget or limits.observation_chars

    def run_python(code: str) -> ToolOutcome:
        execution = sandbox.run(code, on_output=on_output)
        return ToolOutcome(
            ok=execution.ok, text=render(execution, chars, limits.memory_mb), data=execution
        )

    return Tool.of(
        SPEC,
        run_python,
        # the sandbox enforces the cell deadline (interrupt, then restart); this is a backstop
        timeout_s=limits.timeout_s + limits.interrupt_grace_s + 60,
        raises=(
            SandboxError,
        ),  # no sandbox (none could start, or it is gone): not the code's fault
    )
