"""File operations the host asks for with `docker exec`, as the sandbox user.

    files.py stat PATH          one JSON object: path, kind, size, mtime
    files.py read PATH LIMIT    the bytes of a regular file (at most LIMIT; -1: all)
    files.py write PATH         stdin to PATH (folders made as needed)
    files.py list               JSON list of the workspace's files (internals left out)
    files.py tar [FOLDER]       a tar of the workspace (or one folder of it) on stdout:
                                regular files and folders only, hard links as plain files

The container is the confinement; these only take care never to follow a symlink, block
on a FIFO or read without a bound. Errors go to stderr as "<ErrorName>: <what>" with exit
status 2, which the host turns back into the matching Python exception.
"""

import json
import os
import stat
import sys
import tarfile

import boundary


def fail(name: str, message: str) -> None:
    sys.stderr.write(f"{name}: {message}")
    sys.exit(2)


def do_stat(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        print(json.dumps({"path": path, "kind": "missing"}))
        return
    info = {
        "path": path,
        "size": st.st_size,
        "mtime": st.st_mtime,
        "kind": boundary.kind_of(st.st_mode),
    }
    print(json.dumps(info))


def do_read(path: str, limit: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        fail(type(error).__name__, error.strerror or str(error))
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        fail("IsADirectoryError", f"{path} is a directory")
    if not stat.S_ISREG(st.st_mode):
        fail("PermissionError", f"{path} is not a regular file")
    out, left = sys.stdout.buffer, limit if limit >= 0 else float("inf")
    while left > 0:
        chunk = os.read(fd, int(min(1 << 20, left)))
        if not chunk:
            break
        out.write(chunk)
        left -= len(chunk)


def do_write(path: str) -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            while chunk := sys.stdin.buffer.read(1 << 20):
                f.write(chunk)
    except OSError as error:
        fail(type(error).__name__, f"{path}: {error.strerror or error}")


def walk(top: str):
    """(path, lstat) of the folders and regular files under top, internals left out; no
    symlink is followed."""
    for root, dirs, files in os.walk(top):
        if root == top:
            dirs[:] = [d for d in dirs if d != boundary.INTERNAL]
        for name in sorted(dirs) + sorted(files):
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue  # removed meanwhile
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                yield path, st


def do_list() -> None:
    top = boundary.WORKSPACE
    files = [
        {"path": os.path.relpath(p, top), "size": st.st_size, "mtime": st.st_mtime}
        for p, st in walk(top)
        if stat.S_ISREG(st.st_mode)
    ]
    print(json.dumps(sorted(files, key=lambda f: f["path"])))


def do_tar(folder: str) -> None:
    top = os.path.join(boundary.WORKSPACE, folder) if folder else boundary.WORKSPACE
    if not os.path.isdir(top) or os.path.islink(top):
        fail("FileNotFoundError", f"{top} is not a folder")
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as archive:
        for path, st in walk(top):
            info = tarfile.TarInfo(os.path.relpath(path, top))
            info.mtime, info.mode = int(st.st_mtime), st.st_mode & 0o755
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
                continue
            try:  # each file is opened once and sent as what it is now: no link records
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                current = os.fstat(f.fileno())
                if not stat.S_ISREG(current.st_mode):
                    continue  # swapped for something else since the walk
                info.size = current.st_size
                archive.addfile(info, f)


def main(argv: list[str]) -> None:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "stat" and len(args) == 1:
        do_stat(args[0])
    elif command == "read" and len(args) == 2:
        do_read(args[0], int(args[1]))
    elif command == "write" and len(args) == 1:
        do_write(args[0])
    elif command == "list" and not args:
        do_list()
    elif command == "tar" and len(args) <= 1:
        do_tar(args[0] if args else "")
    else:
        fail("ValueError", f"usage: files.py stat|read|write|list|tar ... (got {argv})")


if __name__ == "__main__":
    main(sys.argv[1:])
