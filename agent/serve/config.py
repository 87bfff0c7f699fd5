"""What one server is started with: the model, the limits, its users and where sessions live."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from sandcell.agent.seams import Model
from sandcell.agent.stops import Rules
from sandcell.sandbox.limits import Limits


@dataclass
class ServeConfig:
    model: Model
    users: dict[str, str]  # name -> token
    # name -> the hosts that user's sessions may reach, where their line in --users narrows
    # limits.allow_net (checked against it: agent.hosting.users.Users.narrowed)
    user_allow_net: dict[str, tuple[str, ...]] = field(default_factory=dict)
    data: Path = Path("sandcell-data")
    limits: Limits = field(default_factory=Limits)
    rules: Rules = field(default_factory=Rules)
    protocol: str = "auto"
    vision: str = "auto"  # --vision: the model sees the figures its code made
    image: str | None = None
    max_sessions: int = 8  # sessions holding a sandbox at once
    # of those, one user's, so that another user is still served; None: half of them (at
    # least 1), or all of them when the server has one user
    max_sessions_per_user: int | None = None
    max_user_mb: float = 2048.0  # one user's disk: uploads and session folders, DATA/<user>
    pool: int = 2  # warm sandboxes waiting
    idle_minutes: float = 30.0  # then a session's sandbox is paused (gVisor) or released
    stop_grace_s: float = 8.0  # a stopping server's sessions are paused within this
    max_upload_mb: float = 100.0  # one upload request, all its files together
    max_body_bytes: int = 1 << 20  # any other request body (a message, code to run)
    host: str = "127.0.0.1"  # the address listened on: which Host names are answered
    allowed_hosts: tuple[str, ...] = ()  # --allowed-host: more names ('*': any)
    ray_address: str | None = None  # --ray: sandboxes on a Ray cluster's nodes at this address
    metrics_public: bool = False  # --metrics-public: /metrics without a token (loopback only)

    def limits_of(self, user: str) -> Limits:
        """The limits of `user`'s sessions: the server's, with their narrowed --allow-net."""
        if user in self.user_allow_net:
            return replace(self.limits, allow_net=self.user_allow_net[user])
        return self.limits

    @property
    def idle_s(self) -> float:
        return self.idle_minutes * 60

    @property
    def user_sessions(self) -> int:
        """The cap on one user's sessions holding a sandbox."""
        if self.max_sessions_per_user is not None:
            return min(self.max_sessions_per_user, self.max_sessions)
        return self.max_sessions if len(self.users) == 1 else max(1, self.max_sessions // 2)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * (1 << 20))

    @property
    def max_user_bytes(self) -> int:
        return int(self.max_user_mb * (1 << 20))
