"""One served session: a `Session` in DIR/<user>/<id>/ over a sandbox from the server's pool
that is paused (gVisor) or released when idle, and the one turn (a message or a cell) it takes
at a time."""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from sandcell.agent.events import (
    Event,
    OnEvent,
    Rebuilt,
    Reset,
    SandboxPaused,
    SandboxReleased,
    SandboxResumed,
)
from sandcell.agent.records import history
from sandcell.agent.records.replay import recorded_cells, rerun
from sandcell.agent.records.trace import read_events
from sandcell.agent.seams import RunResult
from sandcell.agent.serve import files, titles
from sandcell.agent.serve.config import ServeConfig
from sandcell.agent.serve.listing import SessionInfo
from sandcell.agent.serve.resume import Past
from sandcell.agent.session import FIGURES_DIR, PAUSED_DIR, Agent
from sandcell.sandbox import Execution, Inputs, SandboxError, checkpoint
from sandcell.sandbox.boundary import FIGURES
from sandcell.sandbox.protocol import Pool, Sandbox
from sandcell.sandbox.renewable import RenewableSandbox

log = logging.getLogger(__name__)
MAX_FIGURE_BYTES = 64 << 20
MB = 1 << 20
STOP_WAIT_S = 30.0  # a cancelled question ends before its next model call


class Busy(RuntimeError):
    """A message or a cell is running in the session already."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class ServedSession:
    def __init__(
        self,
        sid: str,
        user: str,
        folder: Path,
        config: ServeConfig,
        pool: Pool,
        past: Past | None = None,  # a session from before a server restart, continued
        observe: OnEvent | None = None,  # the server's metrics: every event of the session
    ):
        self.id, self.user, self.folder, self.config = sid, user, folder, config
        self.observe = observe
        self.created = past.created if past else _now()
        inputs = past.inputs if past else Inputs()
        # cells that bring a fresh kernel to where the session left off, run as it first starts
        self._rebuild = past.cells if past else []
        self._resuming = past is not None
        # why the kernel was not paused when it last went (the next warning says it)
        self._not_paused = past.not_paused if past else None
        self._lost_node: str | None = None  # the Ray node its sandbox went with (--ray)
        self._rebuilt_for: str | None = None  # ... for the rebuild's event
        paused = folder / PAUSED_DIR
        self.resumed = past is not None  # continued after a server restart
        self.first_question = past.first_question if past else ""  # the default title
        self.url = f"/api/sessions/{sid}"
        self.inputs_dir = folder / files.INPUTS_DIR
        self.sink: OnEvent | None = None  # the running message's stream
        self.uploading = threading.Lock()
        self._busy = threading.Lock()
        self._releasing = threading.Event()  # the idle reaper holds the turn
        self._turn_lock = threading.Lock()
        self._turn = 0  # claims so far: a late cancel knows whether its question is over
        self.asking = False  # a question (not a cell of /execute) has the turn
        self.last_used = time.monotonic()
        self.limits = config.limits_of(user)  # the server's, or the user's narrower network
        self.sandbox = RenewableSandbox(
            lambda inputs: pool.acquire(inputs, allow_net=config.user_allow_net.get(user)),
            self.limits,
            inputs,
            prepare=self._restore,
            released=past is not None,  # no container until it is used
            check_export=self._check_collected,
            resume=pool.resume,
            paused=paused if past is not None and paused.is_dir() else None,
        )
        try:
            self.session = self._agent().session(inputs, folder, sandbox=self.sandbox)
            if past:
                self.session.loop.restore(past.messages, past.questions)
        except BaseException:
            self.sandbox.close()  # its start began with it
            raise
        self.sandbox.on_ready = self.session.sandbox_ready

    def _agent(self) -> Agent:
        config = self.config
        return Agent(
            config.model,
            limits=self.limits,
            rules=config.rules,
            protocol=config.protocol,
            vision=config.vision,
            image=config.image,
            on_event=self._emit,
        )

    # -- one message or cell at a time -----------------------------------------------------
    def claim(self) -> None:
        """Take the session's one turn; Busy if a message or cell has it. An idle pause or
        release under way is waited for: the request then resumes or renews the sandbox."""
        got = self._busy.acquire(blocking=False)
        if not got and self._releasing.is_set():
            while not got and self._releasing.is_set():  # a pause of a big kernel: its time
                got = self._busy.acquire(timeout=1)
            got = got or self._busy.acquire(timeout=1)  # the reaper lets go just after
        if not got:
            raise Busy("a message or cell is running in this session; wait for its answer")
        self._turn += 1

    def done(self) -> None:
        self.touch()
        self._busy.release()

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def ask(self, question: str) -> RunResult:
        """The session's question, in the caller's thread (the stream's worker)."""
        with self._turn_lock:
            self.asking = True
        self.first_question = self.first_question or question
        try:
            return self.session.ask(question)
        finally:
            try:
                history.save(self.folder, self.session.messages)
            except OSError as error:  # the answer stands; only a restart would miss it
                log.warning("history of session %s not saved: %s", self.id, error)
            with self._turn_lock:
                self.asking = False
                # a cancel that came as the question ended must not stop the next one
                self.session.loop.clear_cancel()

    def cancel(self) -> None:
        """Stop the running question: no further model call, and its cell interrupted. The
        interrupt is sent again until the question ends: one sent just before the cell
        started would be lost, and the cell would run on to its deadline."""
        with self._turn_lock:
            if not self.asking:
                return
            self.session.cancel()
            turn = self._turn

        def repeat() -> None:
            deadline = time.monotonic() + STOP_WAIT_S
            while time.monotonic() < deadline:
                time.sleep(0.5)
                with self._turn_lock:
                    if not self.asking or self._turn != turn:
                        return
                try:
                    self.session.interrupt()  # harmless to an idle kernel
                except SandboxError:
                    return  # closed meanwhile: nothing runs any more

        threading.Thread(target=repeat, daemon=True, name=f"cancel-{self.id}").start()

    @property
    def busy(self) -> bool:
        return self._busy.locked()

    def _emit(self, event: Event) -> None:
        if self.observe is not None:
            self.observe(event)
        sink = self.sink
        if sink is not None:
            sink(event)

    # -- what the routes do ------------------------------------------------------------------
    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            title=titles.read(self.folder) or titles.clean(self.first_question),
            created=self.created,
            running=self.busy,
            sandbox=self.sandbox_state(),
            inputs=self.session.inputs.names,
            questions=self.session.loop.questions,
            resumed=self.resumed,
            node=self.sandbox.node,
        )

    def sandbox_state(self) -> Literal["live", "paused", "released"]:
        if self.sandbox.live:
            return "live"
        return "paused" if self.sandbox.paused is not None else "released"

    def url_of(self, host_path: str | Path) -> str:
        rel = Path(host_path).relative_to(self.folder).as_posix()
        return f"{self.url}/files/{quote(rel)}"

    def execute(self, code: str, timeout: float | None) -> Execution:
        """Run code without the model; recorded as a step, so notebook and replay hold it."""
        ex = self.session.sandbox.run(code, timeout)
        self.session.executed(code, ex)
        self.save_figures(ex)
        return ex

    def save_figures(self, ex: Execution) -> list[tuple[str, dict | None]]:
        """Copy the charts a cell showed to figures/ now, not only when the question ends;
        the URL of each, with the data behind it when the kernel sent it. A chart that cannot
        be read is left out, not an error of the question."""
        saved: list[tuple[str, dict | None]] = []
        for result in ex.results:
            path = result.path
            if path is None:
                continue
            name = path.removeprefix(FIGURES + "/")
            if name == path or files.parts_of(name) is None or "/" in name:
                continue
            try:
                data = self.session.sandbox.read(path, MAX_FIGURE_BYTES)
                if len(data) > self._room():
                    log.warning("chart %s of session %s not copied: --max-user-mb", path, self.id)
                    continue
                (self.folder / FIGURES_DIR).mkdir(exist_ok=True)
                tmp = self.folder / FIGURES_DIR / f".{name}.tmp"
                tmp.write_bytes(data)
                os.replace(tmp, self.folder / FIGURES_DIR / name)
            except (SandboxError, OSError) as error:
                log.warning("chart %s of session %s not copied: %s", path, self.id, error)
                continue
            saved.append((f"{self.url}/files/{FIGURES_DIR}/{quote(name)}", result.chart))
        return saved

    # -- the user's disk ---------------------------------------------------------------------
    def _room(self, skip: Path | None = None) -> int:
        """Bytes the user may still add under --max-user-mb (negative when past it)."""
        return self.config.max_user_bytes - files.disk_usage(self.folder.parent, skip)

    def _check_collected(self, staging: Path, names: list[str]) -> None:
        """Files a collect brought to its staging folder fit the user's disk budget, or none
        of them is copied (a SandboxError: a warning of the question, not its failure). What
        they replace is counted off; copies of one file (hard links in the sandbox) are made
        one file first, so they take its bytes once."""
        files.link_duplicates(staging, names)
        adding = files.disk_usage(staging)
        # a file replaced frees its bytes when every name of it is replaced
        replaced: dict[tuple[int, int], list[int]] = {}  # inode: size, links, names replaced
        for name in names:
            try:
                st = os.lstat(files.collect_target(self.folder, name))
            except (FileNotFoundError, NotADirectoryError):
                continue
            if stat.S_ISREG(st.st_mode):
                replaced.setdefault((st.st_dev, st.st_ino), [st.st_size, st.st_nlink, 0])[2] += 1
        freed = sum(size for size, links, gone in replaced.values() if gone >= links)
        if adding - freed > self._room(skip=staging):
            mb = 1 << 20
            raise SandboxError(
                f"the files the code made ({adding / mb:.1f} MB) would take your files past "
                f"your {self.config.max_user_mb:g} MB (--max-user-mb), so none was copied; "
                "delete sessions you no longer need, or save less under /workspace"
            )

    # -- idle pause or release, renewal, end ------------------------------------------------
    def release(self, reason: str = "idle") -> None:
        """Bring back what the code made, then pause the sandbox (gVisor: the next use
        resumes its kernel) or give its container back (the caller holds the turn). At a
        server's stop (`reason` "shutdown") nothing is brought back: after a restart a failed
        resume is followed by a replay, which makes the files again."""
        self._releasing.set()
        why = None  # why the kernel was not paused
        try:
            if self.sandbox.used:  # every failure here is a warning: the release must happen
                if reason != "shutdown":
                    for problem in self.session.bring_back()[1]:
                        log.warning("session %s: %s", self.id, problem)
                why = self._pause(reason)
        finally:
            try:
                if self.sandbox.release() or why is not None:
                    self._not_paused = why
                    self.session.publish(SandboxReleased(reason=reason, not_paused=why))
            finally:
                self._releasing.clear()

    def _pause(self, reason: str) -> str | None:
        """Checkpoint the kernel into the session folder (counted in the user's disk); None
        once it is kept, else why not (the caller then releases the sandbox)."""
        folder = self.folder / PAUSED_DIR
        budget = f"your {self.config.max_user_mb:g} MB (--max-user-mb)"
        if self._room() <= 0:
            return f"your files already take {budget}: no room for its checkpoint"
        began, node = time.monotonic(), self.sandbox.node
        try:
            self.sandbox.pause(folder)
        except Exception as error:  # SandboxError, or an engine's error: never lose the turn
            log.info("session %s not paused: %s", self.id, error)
            return str(error) or type(error).__name__
        size = checkpoint.size(folder)
        if self._room() <= 0:  # as begin_turn counts: no room left refuses the next message
            shutil.rmtree(folder, ignore_errors=True)
            self.sandbox.paused = None
            return f"its checkpoint ({size / MB:.0f} MB) would take your files past {budget}"
        seconds = round(time.monotonic() - began, 2)
        self.session.publish(SandboxPaused(reason=reason, seconds=seconds, size=size, node=node))
        return None

    def node_lost(self, node: str) -> None:
        """The Ray node holding the live sandbox is gone, its kernel with it: the next one,
        on another node, is rebuilt by re-running the recorded cells (and says so)."""
        self.sandbox.release()  # its container went with the node, or another node removes it
        self._rebuild = recorded_cells(read_events(self.folder / "trace.jsonl"))
        self._lost_node = self._rebuilt_for = node
        self.session.publish(SandboxReleased(reason="node_lost", node=node))

    def renewed(self, woke: bool) -> str | None:
        """Called as a message or cell begins, after the sandbox's wake (`woke`: it began
        one); a warning when the kernel is a fresh one. A paused kernel's restore is waited
        for (a few seconds): its outcome decides the warning."""
        if not woke:
            return None
        if self._lost_node is not None:
            lost, self._lost_node = self._lost_node, None
            if not self._rebuild:
                return f"the Ray node {lost} holding this session's sandbox was lost: a fresh one"
            return (
                f"the Ray node {lost} holding this session's sandbox was lost: its kernel is "
                f"rebuilt on another node by re-running its {len(self._rebuild)} recorded "
                "cell(s) (a cell that had run into its time limit or was stopped is not run "
                "again); the files brought back after each answer are in place"
            )
        attempt = self.sandbox.resuming
        why = self._not_paused and f"it could not be paused: {self._not_paused}"
        self._not_paused = None
        if attempt is not None:
            error = attempt.wait()
            node = self.sandbox.node if error is None else None
            self.session.publish(SandboxResumed(seconds=attempt.seconds, error=error, node=node))
            if attempt.kept:
                return None  # no engine now: the use fails and says so; the pause waits
            if error is None:
                self._resuming, self._rebuild = False, []
                return None
            why = f"its paused kernel could not be restored: {error}"
        because = f" ({why})" if why else ""
        if self._resuming:
            self._resuming = False
            if not self._rebuild:
                return None  # no cell had run: a fresh kernel is where it left off
            return (
                "the server restarted since this session was last used: its kernel is rebuilt "
                f"by re-running its {len(self._rebuild)} recorded cell(s) (a cell that had run "
                f"into its time limit or was stopped is not run again){because}"
            )
        # a fresh kernel: recorded as chat's /reset is, so replay restarts its kernel here too
        self.session.publish(Reset(question=self.session.loop.questions, reason="idle"))
        return (
            "this session was idle, so its sandbox was released: the kernel starts fresh "
            "(variables are gone; the input files and the files the code made are back in "
            f"place){because}"
        )

    def _restore(self, sandbox: Sandbox) -> None:
        """Ready a fresh sandbox: after a server restart its kernel is rebuilt by replay (the
        cells make the files again); after an idle release the files are put back."""
        if self._rebuild:
            node, self._rebuilt_for = self._rebuilt_for, None
            began = time.monotonic()
            skipped = rerun(sandbox, self._rebuild, rebuild=True)
            self.session.publish(
                Rebuilt(
                    cells=len(self._rebuild), skipped=len(skipped),
                    reason="node_lost" if node else "restart", node=node,
                    seconds=round(time.monotonic() - began, 3),
                )
            )  # fmt: skip
            self._rebuild = []
            return
        for host, inside in files.collected(self.folder):
            sandbox.write(inside, host.read_bytes())

    def stop(self, pause_by: float | None = None) -> None:
        """End the session: a running question is cancelled and waited for, then the
        sandbox is closed (its container removed). With `pause_by` (a time.monotonic()
        deadline: the server is stopping) the question is waited for until then, and the
        kernel paused if it can be, for a restarted server to resume."""
        if self.asking:
            self.cancel()
        elif self.busy:
            self.session.interrupt()  # a cell of /execute
        wait = STOP_WAIT_S if pause_by is None else max(0.0, pause_by - time.monotonic())
        got = self._busy.acquire(timeout=wait)
        try:
            if got and pause_by is not None and time.monotonic() < pause_by:  # 0: no pause
                self.release("shutdown")
        finally:
            try:
                self.session.close()
            finally:
                if got:
                    self._busy.release()
