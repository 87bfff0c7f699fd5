"""Resource limits of one sandbox, with defaults a CSV analysis needs, the container runtime
that holds them, and the operator's wheelhouse it may install packages from."""

from dataclasses import asdict, dataclass

from sandcell.sandbox.boundary import RICH_BYTES, RICH_OUTPUTS, SPILL_BYTES


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 1024  # RAM, and RAM + swap: no swap at all
    cpus: float = 1.0
    pids: int = 256
    timeout_s: float = 60.0  # wall-clock deadline of one cell
    workspace_mb: int = 512  # tmpfs at /workspace, kept across kernel restarts
    tmp_mb: int = 256  # tmpfs at /tmp
    output_bytes: int = 1 << 20  # stdout/stderr kept per cell (inside the kernel and on the host)
    spill_bytes: int = SPILL_BYTES  # most of one cell's complete output kept in its log file
    # rich outputs (displays, the cell's value) kept per cell, by count and total size (inside
    # the kernel and on the host); a single display over rich_bytes is never kept
    rich_outputs: int = RICH_OUTPUTS
    rich_bytes: int = RICH_BYTES
    observation_chars: int = 4000  # what the model sees of one execution
    open_files: int = 1024
    interrupt_grace_s: float = 3.0  # after an interrupt, how long the kernel has to come back
    # The engine's OCI runtime: None is its default (runc); "runsc" puts gVisor's kernel
    # between model code and the host's. Checked against `docker info` before a start.
    runtime: str | None = None
    # The operator's wheelhouse folder (sandbox/wheelhouse.py), mounted read-only when it fits
    # the image; None: no packages beyond the image's. What pip installs counts in tmp_mb.
    wheelhouse: str | None = None
    # How the host reaches the kernel and the inputs (sandbox/transport.py): "ipc" (folders
    # the engine bind-mounts), "stream" (the engine's API alone), "auto" (ipc where it works)
    transport: str = "auto"
    # --allow-net: the hosts the sandbox may reach through the host's proxy (allowlist.py
    # entries); () is no network at all. net_mb caps the bytes of all its connections.
    allow_net: tuple[str, ...] = ()
    net_mb: int = 100

    @property
    def transfer_bytes(self) -> int:
        """The most one read or export of the workspace takes: its size, and a little (the
        sandbox's helper caps its answer there; a host that receives it, here or from a Ray
        node, caps it again)."""
        return (self.workspace_mb + 16) << 20

    def to_dict(self) -> dict:
        return asdict(self)
