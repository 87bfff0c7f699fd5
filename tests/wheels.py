"""Tiny wheels made in a test from throwaway projects: no index is ever asked (tests never
reach PyPI). A project is a module's source and its metadata; its wheel is packed here as
the wheel format says (METADATA, WHEEL, RECORD with each file's sha256)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    folder: Path, name: str, version: str = "1.0", code: str = "", requires: tuple[str, ...] = ()
) -> Path:
    """A pure-Python wheel of the project `name` (one module, `code`) in `folder`."""
    project = folder / f"{name}-{version}-project"
    (project / name).mkdir(parents=True, exist_ok=True)
    (project / name / "__init__.py").write_text(code or f"VERSION = {version!r}\n")
    info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}/__init__.py": (project / name / "__init__.py").read_bytes(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():  # a fixed time: the same project, the same bytes
            archive.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), data)
    return wheel
