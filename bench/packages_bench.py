"""A package the image lacks, made usable two ways in one run: through the wheelhouse
(`sandcell packages add`, then a sandbox's `%pip install` and import) against rebuilding the
image with `--extra` (then a sandbox of it and the import). The same package, downloaded from
the package index by both (its cached download removed first); the rebuild under a throwaway
image name, removed afterwards. Skipped in the smoke bench (a rebuild takes minutes), and
when no package index answers."""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sandcell.sandbox import DockerSandbox, Limits, image_build
from sandcell.sandbox import container as ctr
from sandcell.sandbox.wheelhouse import Wheelhouse, WheelhouseError, add

PACKAGE = "rapidfuzz==3.14.3"  # a real one a model reaches for; not in the image
MODULE = "rapidfuzz"
THROWAWAY = "sandcell-bench-extra:throwaway"


def _usable(limits: Limits, code: str, image: str | None = None) -> float:
    """Seconds from a sandbox's start to the package imported in it."""
    started = time.perf_counter()
    with DockerSandbox(limits, image=image) as sandbox:
        ex = sandbox.run(code)
        if ex.error is not None:
            raise RuntimeError(f"the package did not import: {ex.error.name}: {ex.error.value}")
    return time.perf_counter() - started


def through_wheelhouse(folder: Path) -> dict:
    client = ctr.engine()
    python = image_build.image_platform(client, ctr.DEFAULT_IMAGE)[0]
    started = time.perf_counter()
    add(Wheelhouse(folder), [PACKAGE], [], [], python)
    added = time.perf_counter() - started
    install = f"%pip install -q {MODULE}\nimport {MODULE}"
    used = _usable(Limits(timeout_s=300, wheelhouse=str(folder)), install)
    return {"add_s": added, "sandbox_s": used, "total_s": added + used}


def through_rebuild(folder: Path) -> dict:
    client = ctr.engine()
    extra = folder / "extra.txt"
    extra.write_text(PACKAGE + "\n")
    pinned = image_build.wheels_for(
        image_build.base_python(client, image_build.DEFAULT_BASE), print
    )
    key = hashlib.sha256(extra.read_bytes() + pinned.name.encode()).hexdigest()[:16]
    shutil.rmtree(image_build.cache_dir() / "image-wheels" / f"extra-{key}", ignore_errors=True)
    started = time.perf_counter()
    built = image_build.build(client, THROWAWAY, extra=extra)
    rebuilt = time.perf_counter() - started
    try:
        used = _usable(Limits(timeout_s=300), f"import {MODULE}", image=THROWAWAY)
    finally:
        for tag in (THROWAWAY, f"{THROWAWAY.rpartition(':')[0]}:{built.hash}"):
            try:
                client.images.remove(tag, force=True)
            except Exception:  # gone already
                pass
        shutil.rmtree(image_build.cache_dir() / "image-wheels" / f"extra-{key}", ignore_errors=True)
    return {"build_s": rebuilt, "sandbox_s": used, "total_s": rebuilt + used}


def run(smoke: bool) -> dict:
    if smoke:
        return {"skipped": "smoke run: the image rebuild takes minutes"}
    with tempfile.TemporaryDirectory(prefix="bench-wheelhouse-") as temp:
        try:
            wheelhouse = through_wheelhouse(Path(temp) / "wh")
        except WheelhouseError as error:
            print(f"bench: the packages row is skipped: {error}", file=sys.stderr)
            return {"skipped": f"no package index answered ({str(error)[:200]})"}
        rebuild = through_rebuild(Path(temp))
    return {
        "package": PACKAGE,
        "wheelhouse": wheelhouse,
        "rebuild": rebuild,
        "ratio": rebuild["total_s"] / wheelhouse["total_s"],
    }


def rows(r: dict, row) -> list[str]:
    if "skipped" in r:
        return [
            row(
                "a package made usable, wheelhouse vs image rebuild",
                f"skipped: {r['skipped']}",
                "",
                None,
            )
        ]
    w, b = r["wheelhouse"], r["rebuild"]
    return [
        row(
            f"seconds to a usable {r['package']}: wheelhouse (add + sandbox + %pip install) vs "
            "image rebuild with --extra (build + sandbox)",
            f"{w['total_s']:.1f} s ({w['add_s']:.1f} + {w['sandbox_s']:.1f}) vs {b['total_s']:.1f} s "
            f"({b['build_s']:.1f} + {b['sandbox_s']:.1f}): {r['ratio']:.1f}× faster",
            "",
            None,
        )
    ]
