"""The served sessions, apart from HTTP: where each lives on disk, whose it is, and the
server's limits: how many hold a sandbox at once (--max-sessions, --max-sessions-per-user),
each user's disk (--max-user-mb), and the pause or release of idle sandboxes (--idle-minutes).
Sessions left on disk by an earlier run of the server are listed again and continued when
next used."""

from __future__ import annotations

import logging
import math
import secrets
import shutil
import threading
import time

from sandcell.agent.metrics import SESSION_STATES, Metrics
from sandcell.agent.serve import files, resume
from sandcell.agent.serve.config import ServeConfig
from sandcell.agent.serve.listing import SessionInfo
from sandcell.agent.serve.served import Busy, ServedSession
from sandcell.agent.session import PAUSED_DIR
from sandcell.sandbox import SandboxPool
from sandcell.sandbox.container import REMOVAL_WAIT_S, engine, reap_orphans
from sandcell.sandbox.protocol import Pool

log = logging.getLogger(__name__)
MB = 1 << 20


class NotFound(LookupError):
    """No such session for this user (another user's answers the same)."""


class Full(RuntimeError):
    """The server holds its most sessions with a sandbox: a 503 with Retry-After."""

    status = 503

    def __init__(self, limit: int, retry_after: int):
        super().__init__(
            f"the server holds its most sessions with a sandbox ({limit}, --max-sessions); "
            f"try again in {retry_after} s, or delete a session you no longer need"
        )
        self.retry_after = retry_after


class ClusterFull(Full):
    """Every `sandcell` slot of the Ray cluster is taken (serve --ray): a 503."""

    def __init__(self, retry_after: int):
        RuntimeError.__init__(
            self,
            "every sandbox slot of the Ray cluster is taken; try again in "
            f"{retry_after} s, or start another node (ray start ... --resources "
            "'{\"sandcell\": N}')",
        )
        self.retry_after = retry_after


class UserFull(Full):
    """This user holds their most sessions with a sandbox: a 429 (their own limit; other
    users are still served)."""

    status = 429

    def __init__(self, limit: int, retry_after: int):
        RuntimeError.__init__(
            self,
            f"you hold your most sessions with a sandbox ({limit}, --max-sessions-per-user); "
            f"try again in {retry_after} s (an idle one's sandbox is released by then), or "
            "delete a session you no longer need",
        )
        self.retry_after = retry_after


class Sessions:
    def __init__(
        self, config: ServeConfig, pool: Pool | None = None, metrics: Metrics | None = None
    ):
        self.config = config
        config.data.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.pool = pool or self._pool(config)
        self._stored = {s.id: s for s in resume.stored_sessions(config.data)}
        self._by_id: dict[str, ServedSession] = {}
        self._lock = threading.Lock()
        self.observe = metrics.observe if metrics is not None else None  # each session's events
        self._uploads: dict[str, threading.Lock] = {}  # a user's uploads, one at a time
        self._closed = threading.Event()
        self._reaper = threading.Thread(target=self._reap, daemon=True, name="idle-sessions")
        self._reaper.start()

    @staticmethod
    def _pool(config: ServeConfig) -> Pool:
        """This host's warm pool, once the containers of a server that was killed are gone;
        with --ray, the cluster's nodes (sandbox/cluster.py; the CLI makes it first)."""
        if config.ray_address is not None:
            from sandcell.sandbox.cluster import RayPool  # imports Ray: only with --ray

            return RayPool(config.ray_address, config.pool, config.limits, config.image)
        removed = reap_orphans(engine(), wait_s=REMOVAL_WAIT_S)
        if removed:
            log.info("removed %d container(s) left by an earlier run", len(removed))
        return SandboxPool(config.pool, config.limits, config.image)

    def create(self, user: str) -> ServedSession:
        with self._lock:
            self._check_room(user)
            sid = secrets.token_hex(8)
            folder = self.config.data / user / sid
            # a user's files are theirs: other accounts on this machine cannot read them
            folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700)
            (folder / files.INPUTS_DIR).mkdir()
            served = ServedSession(sid, user, folder, self.config, self.pool, observe=self.observe)
            self._by_id[sid] = served
            return served

    def get(self, user: str, sid: str) -> ServedSession:
        served = self._by_id.get(sid)
        if served is None and sid in self._stored:
            served = self._resume(user, sid)
        if served is None or served.user != user:
            raise NotFound(f"no session {sid}")
        return served

    def mine(self, user: str) -> list[SessionInfo]:
        """The info of each of the user's sessions, oldest first."""
        listed = [s.info() for s in list(self._by_id.values()) if s.user == user]
        listed += [s.info() for s in list(self._stored.values()) if s.user == user]
        return sorted(listed, key=lambda info: info.created)

    def _resume(self, user: str, sid: str) -> ServedSession | None:
        """A session from before the restart, made live again (no container until used)."""
        with self._lock:
            stored = self._stored.get(sid)
            if stored is None or stored.user != user:
                return self._by_id.get(sid)  # resumed meanwhile, or not this user's
            try:
                past = resume.read_past(stored)
            except (OSError, ValueError, KeyError, TypeError) as error:  # InputError: a ValueError
                log.warning("session %s cannot be continued: %s", sid, error)
                raise NotFound(f"session {sid} cannot be continued: {error}") from None
            served = ServedSession(
                sid, user, stored.folder, self.config, self.pool, past, observe=self.observe
            )
            self._by_id[sid] = served
            del self._stored[sid]
            return served

    def renew(self, served: ServedSession) -> str | None:
        """Make sure the session has a sandbox (a released one takes a fresh one, if there
        is room); a warning when its kernel is a fresh one."""
        node, lost = served.sandbox.node, getattr(self.pool, "lost", None)
        if node is not None and lost is not None and lost(node):  # a cluster's node went
            served.node_lost(node)  # (not under the lock: the other sessions go on)
        with self._lock:
            if not served.sandbox.live:
                self._check_room(served.user)
            woke = served.sandbox.wake()
        return served.renewed(woke)  # not under the lock: it may wait for a restore

    def begin_turn(self, served: ServedSession) -> str | None:
        """Take the session's turn and make sure it has a sandbox, for a message or a cell;
        the renewal's warning. Blocks (an idle release, a start under way): never call it
        on the event loop. OverBudget, Busy, Full: the turn is not kept."""
        self.disk_room(served.user, 0, "no question or cell starts")
        served.claim()
        try:
            return self.renew(served)
        except BaseException:
            served.done()
            raise

    # -- the user's disk ---------------------------------------------------------------------
    def disk_room(self, user: str, wanted: int, what: str) -> int:
        """Bytes the user may still add under --max-user-mb; OverBudget (saying `what` was
        refused) when `wanted` more do not fit, or nothing does."""
        used = files.disk_usage(self.config.data / user)
        room = self.config.max_user_bytes - used
        if wanted > room or room <= 0:
            raise self.over_budget(what, used)
        return room

    def over_budget(self, what: str, used: int) -> files.OverBudget:
        """The 507 a user past --max-user-mb reads: what was refused and what to delete."""
        return files.OverBudget(
            f"{what}: your files take {used / MB:.1f} MB of your {self.config.max_user_mb:g} "
            "MB (--max-user-mb: uploads and session folders); delete sessions you no longer "
            "need (DELETE /api/sessions/{id}) to make room"
        )

    def uploading(self, user: str) -> threading.Lock:
        """Held while one of the user's uploads is saved: two at once cannot both take the
        room that is left."""
        with self._lock:
            return self._uploads.setdefault(user, threading.Lock())

    def delete(self, user: str, sid: str) -> None:
        with self._lock:  # not while a request resumes it
            stored = self._stored.get(sid)
            if stored is not None and stored.user == user:
                del self._stored[sid]
            else:
                stored = None
        if stored is not None:
            shutil.rmtree(stored.folder, ignore_errors=True)
            return
        served = self.get(user, sid)
        with self._lock:
            self._by_id.pop(sid, None)
        served.stop()
        shutil.rmtree(served.folder, ignore_errors=True)

    def states(self) -> dict[str, int]:
        """The sessions by their sandbox's state (live, paused, released): those stored by an
        earlier run of the server and not continued yet are paused or released too."""
        counts = dict.fromkeys(SESSION_STATES, 0)
        for served in list(self._by_id.values()):  # no lock: a scrape never waits for a create
            counts[served.sandbox_state()] += 1
        for stored in list(self._stored.values()):
            counts["paused" if (stored.folder / PAUSED_DIR).is_dir() else "released"] += 1
        return counts

    def _check_room(self, user: str) -> None:
        """Room for one more session with a sandbox: the user's own cap first (their 429),
        then the server's (a 503). A user's cap as large as the server's is the server's."""
        live = [s for s in self._by_id.values() if s.sandbox.live]
        mine = [s for s in live if s.user == user]
        cap = self.config.user_sessions
        if len(mine) >= cap and cap < self.config.max_sessions:
            raise UserFull(cap, self._retry_after(mine))
        if len(live) >= self.config.max_sessions:
            raise Full(self.config.max_sessions, self._retry_after(live))
        room = getattr(self.pool, "room", None)  # a cluster's: its free `sandcell` slots
        if room is not None and not room():
            raise ClusterFull(self._retry_after(live))

    def _retry_after(self, live: list[ServedSession]) -> int:
        """Seconds until the first of these goes idle and the reaper releases its sandbox."""
        now, idle = time.monotonic(), self.config.idle_s
        waits = [s.last_used + idle - now for s in live if not s.busy]
        retry = min(waits) + self._interval() if waits else min(idle, 60)
        return max(1, math.ceil(retry))

    def _interval(self) -> float:
        return max(0.2, min(30.0, self.config.idle_s / 4))

    def _reap(self) -> None:
        while not self._closed.wait(self._interval()):
            for served in list(self._by_id.values()):
                idle = time.monotonic() - served.last_used
                # an upload under way (it may wait for the sandbox's start) is use, not idleness
                if (
                    idle < self.config.idle_s
                    or not served.sandbox.live
                    or served.uploading.locked()
                ):
                    continue
                try:
                    served.claim()
                except Busy:
                    continue
                try:
                    served.release()
                except Exception:  # the reaper must go on for the other sessions
                    log.exception("releasing the sandbox of session %s failed", served.id)
                finally:
                    served.done()

    def close(self) -> None:
        """Every session ends and every container goes: the server is stopping. Each
        session's kernel is paused where it can be (gVisor), all at once, within --stop-grace
        (8 s: with no question streaming, which uvicorn gives GRACE_S first, the whole stop
        fits Docker's usual 10 s); a session still pausing then has its container removed (a
        restart replays it)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            served, self._by_id = list(self._by_id.values()), {}
        for one in served:
            one.cancel()  # all at once: then each is waited for
        grace = self.config.stop_grace_s
        deadline = time.monotonic() + grace
        stopping = [
            threading.Thread(
                target=self._stop, args=(one, deadline), name=f"stop-{one.id}", daemon=True
            )
            for one in served
        ]
        for thread in stopping:
            thread.start()
        late = []
        for thread, one in zip(stopping, served, strict=True):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                if grace:
                    log.warning(
                        "session %s was not paused within %g s (--stop-grace)", one.id, grace
                    )
                # the pause under way fails and its folder goes; all at once, never waited on
                # past REMOVAL_WAIT_S (a restore or replay under way ends with its container)
                closing = threading.Thread(target=one.sandbox.close, daemon=True)
                closing.start()
                late += [closing, thread]
        until = time.monotonic() + REMOVAL_WAIT_S
        for thread in late:
            thread.join(max(0.0, until - time.monotonic()))
        self.pool.close()

    @staticmethod
    def _stop(one: ServedSession, pause_by: float) -> None:
        try:
            one.stop(pause_by)
        except Exception as error:  # SandboxError, an engine's: the other sessions go on
            log.warning("session %s did not close cleanly: %s", one.id, error)
