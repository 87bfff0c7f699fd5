"""Where code runs: sealed Docker containers hosting a Jupyter kernel."""

from sandbox.docker_sandbox import DockerSandbox
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.execution import Error, Execution, Result, StreamChunk
from sandbox.limits import Limits
from sandbox.pool import SandboxPool
from sandbox.render import render

__all__ = [
    "DockerSandbox",
    "Error",
    "Execution",
    "Limits",
    "Result",
    "SandboxError",
    "SandboxPool",
    "SandboxUnavailable",
    "StreamChunk",
    "render",
]
