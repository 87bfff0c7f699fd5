"""A library of recipes: a folder of recipe files (`OUT/recipes/`), each made for one layout
of input (agent.jobs.fingerprint) and named `<layout key>-<n>.py`.

A job tries, with no model, first the recipes of its own layout (the most recently
successful first), then those of layouts close to it, at most MAX_TRIED in all; then the
agent. The first agent-answered job whose outputs pass their checks, when no recipe of the
library solved it, adds a recipe for its layout. `--recipe FILE` is a library of one recipe,
tried on every job whatever its layout, that learns nothing."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from sandcell.agent.jobs import batch_report
from sandcell.agent.jobs.fingerprint import CLOSE, Layout
from sandcell.agent.jobs.recipe_maker import Loaded, RecipeError, from_run, load

FOLDER = batch_report.LIBRARY  # OUT/recipes/
MAX_TRIED = 3  # recipes one job tries before the agent
COPIED = ".copied.json"  # in OUT/recipes/: the sha256 of each library file copied in


@dataclass
class Entry:
    path: Path
    recipe: Loaded
    rank: int = 0  # higher: more recently successful (or, never used yet, learnt later)

    @property
    def name(self) -> str:
        return self.path.name


class Library:
    """The recipes of one folder, shared by a batch's workers (thread-safe). `learning`:
    whether passing agent runs add recipes (not for `--recipe FILE`, nor on a Ray node)."""

    def __init__(self, folder: Path, entries: list[Entry], learning: bool = True):
        self.folder, self.entries, self.learning = folder, entries, learning
        self.any_layout = False  # --recipe FILE: its one recipe is tried on every job
        self._lock = threading.Lock()
        self._ranks = itertools.count(max((e.rank for e in entries), default=0) + 1)

    @classmethod
    def load(cls, folder: Path, learning: bool = True) -> Library:
        """Every `*.py` of the folder (other files are left alone); one that is not a recipe,
        or has no layout, is a RecipeError naming it."""
        entries = []
        for path in sorted(folder.glob("*.py")):
            recipe = load(path)
            if recipe.layout is None:
                raise RecipeError(
                    f"{path} has no fingerprint line, so no layout: a library's recipes are "
                    "made by `batch --recipe auto` (or `sandcell recipe` while the run's inputs "
                    "are still there); move it out of the folder, or give it with --recipe FILE"
                )
            entries.append(Entry(path, recipe, _number(path)))
        return cls(folder, entries, learning)

    @classmethod
    def single(cls, path: Path) -> Library:
        """`--recipe FILE`: that recipe for every job, no learning."""
        library = cls(path.parent, [Entry(path, load(path))], learning=False)
        library.any_layout = True
        return library

    def __getstate__(self) -> dict:  # sent to Ray nodes: without the lock
        state = dict(self.__dict__)
        del state["_lock"], state["_ranks"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._ranks = itertools.count(max((e.rank for e in self.entries), default=0) + 1)

    def candidates(self, layout: Layout) -> list[Entry]:
        """The recipes a job of this layout tries, in order (at most MAX_TRIED)."""
        with self._lock:
            entries = list(self.entries)
        if self.any_layout:
            return entries[:1]
        own = sorted((e for e in entries if e.recipe.layout == layout), key=lambda e: -e.rank)
        close = [
            (closeness, e)
            for e in entries
            if e.recipe.layout not in (None, layout)
            and (closeness := layout.closeness(e.recipe.layout)) >= CLOSE
        ]
        close.sort(key=lambda pair: (-pair[0], -pair[1].rank))
        return (own + [e for _, e in close])[:MAX_TRIED]

    def names_of(self, layout: Layout) -> set[str]:
        """The recipes made for this layout."""
        with self._lock:
            return {e.name for e in self.entries if e.recipe.layout == layout}

    def solved(self, entry: Entry) -> None:
        """The entry solved a job: it is tried first among its layout's from now on."""
        with self._lock:
            entry.rank = next(self._ranks)

    def learn(self, folder: Path, layout: Layout) -> Entry:
        """A recipe from the passed run in `folder` (a job of this layout), added to the
        library's folder as `<key>-<n>.py` (written whole, then moved into place)."""
        recipe = from_run(folder, layout)
        with self._lock:
            taken = [_number(e.path) for e in self.entries if e.name.startswith(layout.key)]
            path = self.folder / f"{layout.key}-{max(taken, default=0) + 1}.py"
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_text(recipe.script(), encoding="utf-8")
            os.replace(temporary, path)
            entry = Entry(path, load(path), next(self._ranks))
            if entry.recipe.layout != layout:  # a bug here: never a recipe no job can find
                path.unlink()
                raise RecipeError(f"{path.name} did not keep its layout in its header")
            self.entries.append(entry)
        return entry


def _number(path: Path) -> int:
    """`<key>-<n>.py`'s n (0 for a file named otherwise)."""
    tail = path.stem.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def start_library(given: Path | None, output: Path) -> Library:
    """OUT/recipes/ for `--recipe auto` (given None) or `--recipe DIR`: a rerun into the same
    OUT resumes with the recipes there; DIR's are copied in first (see _copy_in), DIR itself
    is never written. RecipeError (a usage error) for a DIR that is OUT/recipes itself, or
    holds a file that is not a library recipe."""
    own = output / FOLDER
    if given is not None:
        if own.resolve() == given.resolve():
            raise RecipeError(
                f"{given} is this batch's own library (OUT/{FOLDER}): a rerun into the same "
                "--output resumes with it; give --recipe auto, or another --output"
            )
        _copy_in(Library.load(given), own)  # every file checked before anything is copied
    if not own.is_dir():
        return Library(own, [])
    return Library.load(own)


def _copy_in(given: Library, own: Path) -> None:
    """Each recipe of a given library into OUT/recipes/, once: not again on a rerun (OUT's
    copy may have been edited or removed since: COPIED remembers what came in), nor when the
    same file is there; under the next number of its layout when its name is taken."""
    own.mkdir(parents=True, exist_ok=True)
    manifest = own / COPIED
    copied = set(json.loads(manifest.read_text())) if manifest.is_file() else set()
    present = {_digest(p.read_bytes()) for p in own.glob("*.py")}
    for entry in given.entries:
        data = entry.path.read_bytes()
        digest = _digest(data)
        if digest in copied or digest in present:
            continue
        name = entry.name
        if (own / name).exists():
            assert entry.recipe.layout is not None  # Library.load refuses a recipe without one
            key = entry.recipe.layout.key
            taken = [_number(p) for p in own.glob(f"{key}-*.py")]
            name = f"{key}-{max(taken, default=0) + 1}.py"
        (own / name).write_bytes(data)
        copied.add(digest)
    manifest.write_text(json.dumps(sorted(copied)))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def solved_counts(folder: Path) -> dict[str, int] | None:
    """How many jobs each recipe of the library solved, from the results lines beside it
    (OUT/results.jsonl, as the report reads them); None when there are none."""
    if not (folder.parent / batch_report.RESULTS).is_file():
        return None
    counts: dict[str, int] = {}
    for record in batch_report.records(folder.parent):
        if record.get("solved_by") == "recipe" and isinstance(record.get("recipe"), str):
            name = Path(record["recipe"]).name
            counts[name] = counts.get(name, 0) + 1
    return counts
