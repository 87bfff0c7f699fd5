"""Errors the sandbox raises. Each says what to do next."""


class SandboxError(RuntimeError):
    """The sandbox could not do what was asked."""


class SandboxUnavailable(SandboxError):
    """No Docker engine, or no sandbox image: nothing can run."""
