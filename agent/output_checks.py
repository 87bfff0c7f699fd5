"""Declared checks on a job's outputs: `expect = {"output/clean.csv": "schemas/sales.yaml"}`.

A schema is a pandera DataFrameSchema in pandera's own YAML or JSON form (what
`DataFrameSchema.to_yaml()` writes). It is loaded on the host when the job is read (a schema
pandera cannot load is a usage error), shown to the model in its first request, and run when
the model gives its final answer: in the sandbox, as a fresh `python -I` process over the
bytes then copied back (images/checks.py), never in the model's kernel. A failure goes back
to the model as an observation; the host checks each copied file's sha256 against the one
checked."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from sandcell.sandbox.boundary import WORKSPACE
from sandcell.tools import tables
from sandcell.tools.profile import DELIMITED_EXTS, build_profile, error_text

if TYPE_CHECKING:
    from pandera.api.checks import Check
    from pandera.api.pandas.container import DataFrameSchema

    from sandcell.agent.events import OnEvent
    from sandcell.sandbox.protocol import Sandbox

SCHEMA_FORMS = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
HEAD_BYTES = 1 << 20  # what the profile reads to say how a file is written
MAX_EXAMPLES = 3  # failure cases shown per (column, check)
MAX_GROUPS = 20  # (column, check) groups kept per output
SUMMARY_CHARS = 1500  # one schema as the prompt shows it


class ExpectError(ValueError):
    """An expectation that cannot be used; the message names the file and what to fix."""


@dataclass(frozen=True)
class Schema:
    """One schema file as loaded: plain strings, so a job travels to a Ray node as it is."""

    source: str  # the file, as given
    text: str  # its content, sent to the checker as it is
    form: str  # "yaml" or "json"
    summary: str  # a compact rendering for the prompt


Expect = dict[str, Schema]  # output path under /workspace -> its schema


def load_schema(path: Path) -> Schema:
    form = SCHEMA_FORMS.get(path.suffix.lower())
    if form is None:
        raise ExpectError(f"{path}: a schema file is .yaml, .yml or .json (pandera's own form)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ExpectError(f"{path}: cannot read the schema file ({error_text(error)})") from None
    try:
        schema = _deserialize(text, form)
    except Exception as error:  # whatever pandera or the parser raise: the file is the cause
        raise ExpectError(
            f"{path}: pandera cannot load this schema ({error_text(error)}); write one with "
            "pandera's DataFrameSchema.to_yaml() or to_json()"
        ) from None
    return Schema(str(path), text, form, summarize(schema))


def _deserialize(text: str, form: str) -> DataFrameSchema:
    import yaml
    from pandera.io.pandas_io import deserialize_schema

    loaded = json.loads(text) if form == "json" else yaml.safe_load(text)
    if not isinstance(loaded, dict) or loaded.get("schema_type") != "dataframe":
        raise ValueError('not a serialized DataFrameSchema (no "schema_type: dataframe")')
    return deserialize_schema(loaded)


def output_path(name: str) -> str:
    """An output's path relative to /workspace (as given, or absolute under /workspace)."""
    path = PurePosixPath(name)
    if path.is_absolute():
        if not path.is_relative_to(WORKSPACE):
            raise ExpectError(f"output {name!r}: an output path is under {WORKSPACE}")
        path = path.relative_to(WORKSPACE)
    if not path.parts or ".." in path.parts or str(path) == ".":
        raise ExpectError(f"output {name!r}: name a file under {WORKSPACE}, e.g. output/clean.csv")
    return str(path)


def load_expect(pairs: Mapping[str, str | Path | Schema], base: Path) -> Expect:
    """{output: schema file (relative to base) or a loaded Schema} -> Expect."""
    expect: Expect = {}
    for name, schema in pairs.items():
        if not isinstance(name, str):
            raise ExpectError(f"expect maps output paths to schema files, got {name!r}")
        if not isinstance(schema, Schema):
            if not isinstance(schema, str | Path):
                raise ExpectError(f"expect[{name!r}]: a schema file path, got {schema!r}")
            schema = load_schema(base / schema)
        expect[output_path(name)] = schema
    return expect


def parse_pairs(pairs: tuple[str, ...] | list[str], base: Path) -> Expect:
    """`--expect OUT=SCHEMA` values."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        out, sep, schema = pair.partition("=")
        if not sep or not out or not schema:
            raise ExpectError(f"--expect {pair!r}: write OUT=SCHEMA, e.g. output/clean.csv=s.yaml")
        mapping[out] = schema
    return load_expect(mapping, base)


# -- what the model is told ------------------------------------------------------------------


def summarize(schema: DataFrameSchema) -> str:
    """A pandera schema in a few lines: columns with dtype, nulls, uniqueness, checks."""
    flags = [name for name in ("strict", "ordered", "coerce") if getattr(schema, name, False)]
    if schema.strict == "filter":
        flags[0] = "strict=filter (other columns dropped)"
    if schema.unique:
        flags.append(f"rows unique over {list(schema.unique)}")
    lines = [f"table: {', '.join(flags)}"] if flags else []
    for name, column in schema.columns.items():
        parts = [str(column.dtype) if column.dtype is not None else "any dtype"]
        parts.append("nulls allowed" if column.nullable else "no nulls")
        parts += ["unique"] * bool(column.unique) + ["optional"] * (not column.required)
        parts += [_check_text(check) for check in column.checks]
        lines.append(f"- {name}: {', '.join(parts)}")
    lines += [f"- table check: {_check_text(check)}" for check in schema.checks]
    text = "\n".join(lines)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 4] + "\n..."


def _check_text(check: Check) -> str:
    return str(check.error or check.name or "check")


def describe(expect: Expect) -> str:
    """The expectations as the system prompt shows them, beside the input profiles."""
    if not expect:
        return ""
    blocks = [
        f"{WORKSPACE}/{path} (schema {Path(schema.source).name}):\n{schema.summary}"
        for path, schema in expect.items()
    ]
    return (
        "Expected outputs: when you give your Final Answer these files are checked against "
        "their pandera schemas; the answer is accepted only when they pass.\n" + "\n".join(blocks)
    )


def outcome_lines(outputs: dict, code: Callable[[str], str] = str) -> list[str]:
    """Each output's verdict and its failures, bounded, one line each (`code` marks names)."""
    lines = []
    for path, verdict in outputs.items():
        digest = f" (sha256 {code(verdict['sha256'][:16])}...)" if verdict.get("sha256") else ""
        said = "passed" if verdict["passed"] else "failed"
        lines.append(f"- {code(f'{WORKSPACE}/{path}')}{digest}: {said}")
        for case in verdict["failures"][:MAX_GROUPS]:
            where = f"column {code(str(case['column']))}, " if case.get("column") else ""
            head = f"  - {where}check {code(str(case['check']))}"
            if case.get("message"):  # the file could not be read or checked: why
                lines.append(f"{head}: {str(case['message'])[:300]}")
                continue
            shown = "; ".join(_example(e) for e in case.get("examples", [])[:MAX_EXAMPLES])
            lines.append(
                f"{head}: {case.get('count')} failure(s)" + (f", e.g. {shown}" * bool(shown))
            )
    return lines


def markdown(checks: dict) -> str:
    """answer.md's Checks section."""
    head = "All declared checks passed." if checks["passed"] else "The declared checks FAILED."
    lines = outcome_lines(checks["outputs"], code=lambda s: f"`{s}`")
    return "## Checks\n\n" + head + "\n\n" + "\n".join(lines) + "\n"


def feedback(outputs: dict, attempt: int, retries: int) -> str:
    """A failed check as the observation the model gets: bounded, per output and check."""
    lines = [
        f"Your Final Answer was not accepted: the output files failed their checks (attempt "
        f"{attempt} of {retries}).",
        *outcome_lines(outputs),
    ]
    lines.append(
        "Fix the files with the python tool, then give your Final Answer again; they are "
        "checked again then."
    )
    return "\n".join(lines)


def _example(example: object) -> str:
    if isinstance(example, dict):
        return f"row {example.get('index')}: {example.get('value')!r}"
    return repr(example)


# -- running them --------------------------------------------------------------------------


GUESSED_KINDS = {".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".jsonl": "jsonl",
                 ".json": "json", ".xlsx": "xlsx"}  # fmt: skip


def guessed_hints(path: str) -> dict:
    """How an output is most likely written, from its name alone (CSV: what pandas writes by
    default). The checks are run with this first; `hints` of the bytes then read decides
    whether the guess held."""
    kind = GUESSED_KINDS.get(PurePosixPath(path).suffix.lower(), "csv")
    if kind not in ("csv", "tsv"):
        return {"kind": kind, "delimiter": None, "encoding": None, "errors": None}
    delimiter = "\t" if kind == "tsv" else ","
    return {"kind": kind, "delimiter": delimiter, "encoding": "utf-8", "errors": "strict"}


def hints(path: str, head: bytes, complete: bool) -> dict:
    """How the output is written, as the file-metadata profile of its first bytes says
    (kind, delimiter, encoding): the checker must have read it so for its verdict to stand."""
    profile = build_profile(path, len(head), None, head, complete=complete)
    kind = profile.kind
    if kind == "text" and PurePosixPath(path).suffix.lower() in DELIMITED_EXTS:
        kind = "csv"  # one column: no delimiter to find
    encoding = tables.detect_encoding(head, complete) if kind in ("csv", "tsv") else None
    return {
        "kind": kind,
        "delimiter": profile.delimiter,
        "encoding": encoding.codec if encoding else None,
        "errors": encoding.errors if encoding else None,
    }


@dataclass
class Verdict:
    passed: bool
    outputs: dict  # path -> {"passed", "sha256", "size", "failures"}
    duration_s: float
    cpu_s: float | None  # the checker process's CPU-seconds

    def record(self) -> dict:
        """The results line's `checks`."""
        return {"passed": self.passed, "outputs": self.outputs}


def run_checks(sandbox: Sandbox, expect: Expect, max_bytes: int) -> Verdict:
    """The checker run on every output, each read as its name suggests (guessed_hints); the
    checker sends back the first bytes it read, and an output whose bytes say it is written
    otherwise is checked again, read as they say (one more run, for those outputs only)."""
    started, cpu_s = time.monotonic(), 0.0
    reads = {path: guessed_hints(path) for path in expect}
    outputs: dict[str, dict] = {}
    for _ in range(2):  # the guess, then what the bytes said where it was wrong
        items = [{"path": p, "schema": expect[p].text, "form": expect[p].form, "read": read,
                  "head_bytes": HEAD_BYTES} for p, read in reads.items()]  # fmt: skip
        answer = sandbox.run_checks({"outputs": items, "max_bytes": max_bytes,
                                     "examples": MAX_EXAMPLES, "groups": MAX_GROUPS})  # fmt: skip
        spent = answer.get("cpu_s")
        cpu_s += spent if isinstance(spent, int | float) else 0.0
        misread = {}
        for path, read in reads.items():
            raw = answer["outputs"].get(path)
            outputs[path] = _verdict(raw)
            head = _head(raw)
            if head is None:  # not read (missing, not a file): the verdict says why
                if outputs[path]["passed"]:  # a pass on bytes nobody can look at: none
                    outputs[path] = _verdict(None, f"no bytes came back for {path}")
                continue
            actual = hints(path, head, complete=len(head) < HEAD_BYTES)
            if actual != read:
                misread[path] = actual
                outputs[path] = _verdict(None, f"{WORKSPACE}/{path} changed while it was checked")
        if not misread:
            break
        reads = misread
    return Verdict(
        all(v["passed"] for v in outputs.values()),
        outputs,
        round(time.monotonic() - started, 3),
        round(cpu_s, 3),
    )


def _head(raw: object) -> bytes | None:
    """The first bytes of the output as the checker read them, None if it sent none."""
    try:
        return base64.b64decode(raw["head"], validate=True)  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return None


def _verdict(raw: object, why: str = "no verdict") -> dict:
    """One output's verdict as the checker sent it, kept to its known shape."""
    if not isinstance(raw, dict):
        return {"passed": False, "sha256": None, "failures": [_said("checker", why)]}
    failures = [f for f in raw.get("failures") or [] if isinstance(f, dict)][:MAX_GROUPS]
    return {
        "passed": raw.get("passed") is True and not failures,
        "sha256": raw.get("sha256") if isinstance(raw.get("sha256"), str) else None,
        "failures": failures,
    }


def _said(check: str, message: str) -> dict:
    return {"column": None, "check": check, "count": 1, "examples": [], "message": message}


def not_checked(expect: Expect, why: str) -> dict:
    """The results line's `checks` for a job that stopped before its outputs were checked."""
    outputs = {p: {"passed": False, "sha256": None, "failures": [_said("not_run", why)]}
               for p in expect}  # fmt: skip
    return {"passed": False, "outputs": outputs}


def verify_copied(checks: dict, place: Callable[[str], Path]) -> list[str]:
    """Each checked file as copied to the host must hold the bytes checked (same sha256);
    one that does not is marked failed. The problems, in words."""
    problems = []
    for path, verdict in checks["outputs"].items():
        if not verdict["passed"]:
            continue
        host = place(path)
        digest = hashlib.sha256(host.read_bytes()).hexdigest() if host.is_file() else None
        if digest != verdict["sha256"]:
            why = "was not copied back" if digest is None else "changed after its check"
            verdict["passed"] = False
            verdict["failures"] = [_said("copied", f"{WORKSPACE}/{path} {why}")]
            problems.append(f"{WORKSPACE}/{path} {why}")
    checks["passed"] = all(v["passed"] for v in checks["outputs"].values())
    return problems


class Checker:
    """The loop's `verify`: runs the checks when the model gives its final answer, publishes
    each run, and returns None when they pass, else the observation for the model."""

    def __init__(
        self, expect: Expect, sandbox: Sandbox, publish: OnEvent, retries: int, max_bytes: int
    ):
        self.expect, self.sandbox, self.publish = expect, sandbox, publish
        self.retries, self.max_bytes = retries, max_bytes
        self.last: Verdict | None = None
        self.attempts, self.question = 0, 0

    def __call__(self, question: int) -> str | None:
        from sandcell.agent.events import ChecksRun  # events import nothing from jobs

        if question != self.question:  # each question gets its own retries
            self.attempts, self.question = 0, question
        self.attempts += 1
        verdict = self.last = run_checks(self.sandbox, self.expect, self.max_bytes)
        self.publish(
            ChecksRun(
                question=question,
                attempt=self.attempts,
                passed=verdict.passed,
                outputs=verdict.outputs,
                duration_s=verdict.duration_s,
                cpu_s=verdict.cpu_s,
            )
        )
        return None if verdict.passed else feedback(verdict.outputs, self.attempts, self.retries)
