"""Where code runs: sealed Docker containers hosting a Jupyter kernel.

`from sandcell import DockerSandbox, Limits, render` is the front door; these are the same
names, for code that wants only the sandbox's."""

# render first: the function shares its module's name, and binding it after the submodule
# keeps `sandcell.sandbox.render` the function (as it has always been).
from sandcell.sandbox.render import render as render  # noqa: I001
from sandcell.sandbox.background import BackgroundSandbox
from sandcell.sandbox.docker_sandbox import DockerSandbox
from sandcell.sandbox.errors import SandboxError, SandboxUnavailable
from sandcell.sandbox.execution import Execution, ExecutionError, Result, StreamChunk
from sandcell.sandbox.inputs import Input, InputError, Inputs
from sandcell.sandbox.limits import Limits
from sandcell.sandbox.pool import SandboxPool
from sandcell.sandbox.protocol import Sandbox
from sandcell.sandbox.renewable import RenewableSandbox

__all__ = [
    "BackgroundSandbox",
    "DockerSandbox",
    "Execution",
    "ExecutionError",
    "Input",
    "InputError",
    "Inputs",
    "Limits",
    "RenewableSandbox",
    "Result",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxUnavailable",
    "StreamChunk",
    "render",
]
