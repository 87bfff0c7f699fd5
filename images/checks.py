"""The checks of a job's outputs, run by the host with `docker exec` as a fresh process:

    python -I checks.py  < {"outputs": [{"path", "schema", "read"}], "max_bytes", ...}

It never runs in the model's kernel, whose code could patch pandas or pandera: `-I` keeps
PYTHON* variables, the user's site folder, the working folder (/workspace) and the script's
folder off sys.path, so only the image's read-only packages are imported. Each output file is
read once; its sha256 is of the very bytes validated. A schema is pandera's serialized form
(DataFrameSchema.to_yaml/to_json), parsed from the text the host sent, never from a path.
One JSON object goes to stdout: per path {"passed", "sha256", "size", "failures", "head"}
(head: the file's first `head_bytes` bytes, base64), and the process's CPU-seconds.

Where the supervisor (PID 1) serves checks (a renewed sandbox: it has pandas and pandera
loaded already), this process only hands the request to it over boundary.CHECKS_SOCKET and
prints the answer of the checker it forks (`answer` below, in a process that never ran model
code): no second import of pandas and pandera per check. Anywhere else it checks itself.
"""

import base64
import hashlib
import io
import json
import os
import resource
import socket
import stat
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
if HERE not in sys.path:  # -I: boundary is beside us (the supervisor has it on its path)
    sys.path.insert(0, HERE)
import boundary  # noqa: E402


def failure(check: str, message: str, column: str | None = None) -> dict:
    return {"column": column, "check": check, "count": 1, "examples": [], "message": message[:300]}


def read_once(path: str, limit: int) -> bytes:
    """The file's bytes, read once (no symlink followed, no FIFO waited on, bounded)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is over {limit} bytes")
    return data


def frame(data: bytes, read: dict):
    """The table as pandas reads it, the way the host says it is written (kind, encoding,
    delimiter): guessed from its name first; the host then profiles the head sent back."""
    import pandas as pd

    kind, buffer = read.get("kind"), io.BytesIO(data)
    if kind in ("csv", "tsv"):
        return pd.read_csv(
            buffer,
            sep=read.get("delimiter") or ",",
            encoding=read.get("encoding") or "utf-8",
            encoding_errors=read.get("errors") or "strict",
        )
    if kind == "jsonl":
        return pd.read_json(buffer, lines=True)
    if kind == "json":
        return pd.read_json(buffer)
    if kind == "parquet":
        return pd.read_parquet(buffer)
    if kind == "xlsx":
        return pd.read_excel(buffer, engine="openpyxl")
    raise ValueError(
        f"profiled as {kind!r}, not a table the checks read: write CSV, Parquet, JSON lines "
        "or Excel"
    )


def schema_of(text: str, form: str):
    import yaml
    from pandera.io.pandas_io import deserialize_schema

    loaded = json.loads(text) if form == "json" else yaml.safe_load(text)
    return deserialize_schema(loaded)


def failures_of(cases, examples: int, groups: int) -> list[dict]:
    """pandera's failure cases, bounded: per (column, check) the count and a few examples."""
    out: list[dict] = []
    for (column, check), rows in cases.groupby(["column", "check"], dropna=False, sort=False):
        if len(out) >= groups:
            break
        shown = [
            {"index": _plain(i), "value": _plain(v)}
            for i, v in zip(rows["index"][:examples], rows["failure_case"][:examples], strict=True)
        ]
        column = None if column is None or column != column else str(column)
        out.append({"column": column, "check": str(check), "count": len(rows), "examples": shown})
    return out


def _plain(value: object) -> object:
    if value is None or isinstance(value, bool | int | str):
        return value if not isinstance(value, str) else value[:100]
    if isinstance(value, float):
        return None if value != value else value
    return str(value)[:100]


def check_one(item: dict, limit: int, examples: int, groups: int) -> dict:
    path = os.path.join(boundary.WORKSPACE, item["path"])
    result = {"passed": False, "sha256": None, "size": None, "failures": []}
    try:
        data = read_once(path, limit)
    except FileNotFoundError:
        result["failures"] = [failure("file_exists", f"{path} does not exist")]
        return result
    except OSError as error:
        result["failures"] = [failure("readable", str(error))]
        return result
    result["sha256"], result["size"] = hashlib.sha256(data).hexdigest(), len(data)
    # the host profiles these bytes: the verdict stands only if they are written as read here
    result["head"] = base64.b64encode(data[: int(item.get("head_bytes", 0))]).decode()
    read = item.get("read") or {}
    try:
        df = frame(data, read)
    except Exception as error:  # any parse error is the output's, said to the model
        result["failures"] = [failure("readable", f"{type(error).__name__}: {error}")]
        return result
    import pandera.errors

    try:
        schema_of(item["schema"], item.get("form", "yaml")).validate(df, lazy=True)
    except pandera.errors.SchemaErrors as errors:
        result["failures"] = failures_of(errors.failure_cases, examples, groups)
    except Exception as error:  # a check that raised: a failure, not a crash of the checker
        result["failures"] = [failure("validate", f"{type(error).__name__}: {error}")]
    result["passed"] = not result["failures"]
    return result


def answer(request: dict) -> dict:
    """The verdict on every output the request names, and the CPU-seconds it took."""
    from pandera.config import CONFIG, ValidationDepth

    CONFIG.validation_enabled = True  # whatever the environment said
    CONFIG.validation_depth = ValidationDepth.SCHEMA_AND_DATA
    limit, examples = int(request["max_bytes"]), int(request.get("examples", 3))
    groups = int(request.get("groups", 20))
    outputs = {
        item["path"]: check_one(item, limit, examples, groups) for item in request["outputs"]
    }
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"outputs": outputs, "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}


def from_supervisor(request: bytes) -> bytes | None:
    """The supervisor's checker's answer, or None where none answers (not listening yet, or
    the socket is not PID 1's)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(boundary.CHECKS_SOCKET)
            if boundary.peer_credentials(conn)[0] != 1:
                return None
            conn.sendall(request)
            conn.shutdown(socket.SHUT_WR)
            reply = read_all(conn, boundary.checks_answer_bytes(json.loads(request)))
        except OSError:
            return None
    try:
        return reply if isinstance(json.loads(reply).get("outputs"), dict) else None
    except (ValueError, AttributeError):
        return None  # killed, or cut: checked here instead


def read_all(conn: socket.socket, limit: int) -> bytes:
    """What the peer sends until it closes, at most limit bytes."""
    data = bytearray()
    while len(data) <= limit:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    return bytes(data[: limit + 1])


REQUEST_BYTES = 8 << 20  # the schemas' text and how to read each output: far less


def main() -> None:
    request = sys.stdin.buffer.read(REQUEST_BYTES)
    reply = from_supervisor(request)
    if reply is None:
        reply = json.dumps(answer(json.loads(request)) | {"checker": "process"}).encode()
    sys.stdout.buffer.write(reply)


if __name__ == "__main__":
    main()
