"""One agent run per layout at a time: while the agent learns a layout in one job, the other
jobs of that layout wait for the run to end (and are then tried with its recipe) instead of
starting agent runs of their own. A waiting job holds neither a worker nor a sandbox: it is
parked here and handed back to the batch's queue when the run ends, but never before its
own thread has let go of it (settled: its session closed). A layout whose learning run
failed its checks twice stops making others wait: its next jobs go to the agent. On a Ray
cluster the driver keeps one for the whole batch (agent/jobs/ray_learning.py)."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

GIVE_UP_AFTER = 2  # learning runs of one layout that failed before jobs stop waiting for it


class LayoutLearning:
    def __init__(self, requeue: Callable[[list[Any]], None]):
        self._requeue = requeue  # jobs back to the front of the batch's queue
        self._lock = threading.Lock()
        self._learners: dict[str, str] = {}  # layout key -> the job whose agent run learns it
        self._failed: Counter[str] = Counter()
        self._learned: Counter[str] = Counter()  # recipes learnt per layout, by this batch
        self._parked: defaultdict[str, list[Any]] = defaultdict(list)
        self._unsettled: set[str] = set()  # parked jobs whose thread still holds them
        self._due: dict[str, Any] = {}  # ... of those, the ones to requeue once settled

    def park_if_learning(self, key: str, job: Any) -> bool:
        """Before a job starts: parked (True) when its layout is being learned now, by
        another job (on a Ray cluster a learning job whose node died starts again)."""
        with self._lock:
            if self._learners.get(key, job.id) == job.id:
                return False
            self._park(key, job)
            return True

    def learned(self, key: str) -> int:
        """How many recipes of the layout this batch has learnt: a job notes it before it
        chooses its recipes, and gives it to claim()."""
        with self._lock:
            return self._learned[key]

    def claim(self, key: str, job: Any, learned_before: int) -> bool:
        """A job needs the agent: True when it may run it (it learns the layout, or the
        layout gave up waiting); False when another job learns it now (the job is parked),
        or learnt it since the job chose its recipes (the job goes back to the queue once
        settled, to be tried with the new recipe). A job that learns the layout already (claimed
        for it before it was sent to a node, or run again there) may."""
        with self._lock:
            if self._failed[key] >= GIVE_UP_AFTER or self._learners.get(key) == job.id:
                return True
            if key in self._learners:
                self._park(key, job)
                return False
            if self._learned[key] != learned_before:
                self._unsettled.add(job.id)
                self._due[job.id] = job
                return False
            self._learners[key] = job.id
            return True

    def _park(self, key: str, job: Any) -> None:
        self._parked[key].append(job)
        self._unsettled.add(job.id)

    def restarted(self, job: Any) -> None:
        """The job starts again where an earlier try of it may have been parked (a Ray task
        run again after its node died): what that try arranged for it is void."""
        with self._lock:
            for waiting in self._parked.values():
                waiting[:] = [j for j in waiting if j.id != job.id]
            self._unsettled.discard(job.id)
            self._due.pop(job.id, None)

    def is_parked(self, job: Any) -> bool:
        """Whether the job waits here (its thread has not settled it yet)."""
        with self._lock:
            return job.id in self._unsettled

    def settled(self, job: Any) -> None:
        """The parked job's thread let go of it (its session closed): requeued now if its
        layout's run ended meanwhile."""
        with self._lock:
            self._unsettled.discard(job.id)
            due = self._due.pop(job.id, None)
        if due is not None:
            self._requeue([due])

    def ended(self, job_id: str, learned: bool) -> None:
        """A job ended (recorded, or failed outright, whatever happened); if it was learning
        a layout, the jobs that waited for it go back to the queue (each once its own thread
        let go of it), to be tried with what it learned."""
        with self._lock:
            key = next((k for k, learner in self._learners.items() if learner == job_id), None)
            if key is None:
                return  # not a learner (a recipe solved it, or its layout gave up waiting)
            del self._learners[key]
            if learned:
                self._learned[key] += 1
            else:
                self._failed[key] += 1
            waiting = self._parked.pop(key, [])
            ready = [job for job in waiting if job.id not in self._unsettled]
            self._due.update((job.id, job) for job in waiting if job.id in self._unsettled)
        if ready:
            self._requeue(ready)
