"""Where code runs: sealed Docker containers hosting a Jupyter kernel.

The names load on first use (PEP 562), so importing a light part (`sandbox.errors`,
`sandbox.boundary`, `sandbox.inputs`) does not import the Docker client."""

import importlib

# Loaded now, not lazily: the function shares its module's name, and a lazy name would be
# shadowed by the submodule once anything imports `sandbox.render`.
from sandbox.render import render as render

_HOMES = {
    "BackgroundSandbox": "sandbox.background",
    "DockerSandbox": "sandbox.docker_sandbox",
    "Error": "sandbox.execution",
    "Execution": "sandbox.execution",
    "Input": "sandbox.inputs",
    "InputError": "sandbox.inputs",
    "Inputs": "sandbox.inputs",
    "Limits": "sandbox.limits",
    "RenewableSandbox": "sandbox.renewable",
    "Result": "sandbox.execution",
    "Sandbox": "sandbox.protocol",
    "SandboxError": "sandbox.errors",
    "SandboxPool": "sandbox.pool",
    "SandboxUnavailable": "sandbox.errors",
    "StreamChunk": "sandbox.execution",
}
__all__ = sorted([*_HOMES, "render"])


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
