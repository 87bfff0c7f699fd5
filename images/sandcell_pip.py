"""`%pip install` and `!pip install` in the kernel, with no network.

When the host mounted the operator's wheelhouse (boundary.WHEELHOUSE), pip takes packages from
its index alone (links with sha256, which pip checks) into boundary.PACKAGES_DIR, a prefix on
the /tmp tmpfs that is on this kernel's path (and its children's, through PYTHONPATH) and on
no other: the checker runs `python -I`. pip resolves against what the image has, so a package
needing numpy uses the image's. The names asked for are checked against the index before pip
starts: a package the wheelhouse lacks fails at once, with the closest names it offers."""

import difflib
import importlib
import importlib.metadata
import os
import re
import site
import sysconfig

import boundary

MAX_LISTED = 5
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class PackageInstallError(RuntimeError):
    """pip could not install a package."""

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of a traceback: the one line is the whole story (the
        frames would be the kernel extension's, not the cell's)."""
        return [f"{type(self).__name__}: {self}"]


class PackageNotOffered(PackageInstallError):
    """A package the sandbox cannot install offline (checked before pip starts)."""


def site_dirs() -> list[str]:
    paths = sysconfig.get_paths(
        vars={"base": boundary.PACKAGES_DIR, "platbase": boundary.PACKAGES_DIR}
    )
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def mounted() -> bool:
    return os.path.isdir(boundary.WHEELHOUSE_INDEX)


def configure() -> None:
    """pip's settings for this kernel and the processes it starts, when a wheelhouse is
    mounted: its index only, the prefix, no cache (it would fill /tmp twice)."""
    if not mounted():
        return
    for folder in site_dirs():
        os.makedirs(folder, exist_ok=True)
        site.addsitedir(folder)
    os.environ.pop("PIP_NO_INDEX", None)
    os.environ.update(
        PIP_INDEX_URL=f"file://{boundary.WHEELHOUSE_INDEX}",
        PIP_PREFIX=boundary.PACKAGES_DIR,
        PIP_NO_CACHE_DIR="1",
        PIP_ONLY_BINARY=":all:",
        PIP_NO_WARN_SCRIPT_LOCATION="1",
    )
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(path + site_dirs())


def requested(cmd: str) -> list[str] | None:
    """The package names a `pip install` command line asks for; None when it runs none."""
    found = boundary.pip_install_requirements(cmd)
    return None if found is None else [boundary.requirement_name(r) for r in found]


def offered() -> list[str]:
    """The projects the wheelhouse's index lists (normalised)."""
    try:
        with os.scandir(boundary.WHEELHOUSE_INDEX) as entries:
            return sorted(e.name for e in entries if e.is_dir() and NAME.fullmatch(e.name))
    except OSError:
        return []


def installed(name: str) -> bool:
    """Whether the image (or an earlier install) has the project: one lookup by name, not a
    read of every package's metadata (slow under gVisor)."""
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def check(names: list[str]) -> None:
    """Raise PackageNotOffered for names (normalised, as requested() gives them) neither
    installed nor in the wheelhouse."""
    index = offered()
    missing = [n for n in names if n not in index and not installed(n)]
    if not missing:
        return
    said = ", ".join(missing[:MAX_LISTED])
    if not mounted():
        raise PackageNotOffered(
            f"{said}: not available offline (no network, and no wheelhouse is mounted); the "
            f"image's packages are listed in {boundary.PACKAGES_FILE}"
        )
    close = []
    for name in missing:
        close += difflib.get_close_matches(name, index, n=3, cutoff=0.6)  # names normalised
    hint = (
        f"; the closest the wheelhouse offers: {', '.join(dict.fromkeys(close))}"
        if close
        else f"; the wheelhouse offers {len(index)} package(s): {', '.join(index[:MAX_LISTED])}"
        + (", ..." if len(index) > MAX_LISTED else "")
    )
    raise PackageNotOffered(
        f"{said}: not available offline{hint} (the user can add it: sandcell packages add NAME)"
    )


def installed_now() -> None:
    """After pip: new folders on the path are seen, new .pth files read."""
    importlib.invalidate_caches()
    for folder in site_dirs():
        site.addsitedir(folder)


def failed(status: int) -> PackageInstallError:
    where = "the wheelhouse's index" if mounted() else "nowhere: the sandbox has no network"
    return PackageInstallError(
        f"pip install failed (exit status {status}, said above): packages come from {where}, "
        "besides those already in the image"
    )
