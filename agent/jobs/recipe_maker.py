"""Recipes: the code of a run whose output passed its checks, as one script in the percent
format (`# %%` cells, as Jupytext, VS Code and Spyder read it), with each input a parameter.

The cells come from the trace (the cells that ran to their end without an error, after the
last reset); every literal path of an input (`/data/<name>`, in any string) becomes
`INPUTS[i]`, rewritten on the syntax tree with LibCST so comments and layout stay. The first
cell sets INPUTS; a batch replaces that cell with each job's own inputs."""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

import libcst as cst

from sandcell.agent.events import ChecksRun, Event, Final, Reset, Step
from sandcell.agent.jobs.fingerprint import Layout
from sandcell.agent.records.trace import all_inputs, read_events
from sandcell.sandbox.boundary import DATA, REQUIREMENT, pip_install_requirements

CELL = "# %%"
FINGERPRINT = "# fingerprint: "  # a header line: the layout of the inputs it was made for (JSON)
PACKAGES = "# packages: "  # a header line: what its cells `pip install`ed (a JSON list)
PARAMETERS = '# %% tags=["parameters"]'  # Jupytext's (and papermill's) parameters cell
PARAMETER = "INPUTS"


class RecipeError(ValueError):
    """No recipe can be made from this folder, or the file is not a recipe: the message says
    why and what to do."""


@dataclass
class Recipe:
    cells: list[str]  # the code, parameters already in place
    inputs: list[dict]  # the run's inputs: {"name", "path", "size", "sha256"}
    source: str = ""  # the run folder it came from
    checks: dict = field(default_factory=dict)  # OUTPUT -> the sha256 that passed its checks
    left_out: int = 0  # cells that failed or were stopped
    layout: Layout | None = None  # its inputs' shape, when they could be read
    packages: list[str] = field(default_factory=list)  # what its cells pip installed

    def script(self) -> str:
        header = [  # every name repr()ed: a newline in one cannot end the comment
            f"# sandcell recipe, made from the run in {self.source!r}",
            f"# {len(self.cells)} cells; {self.left_out} that failed or were stopped left out.",
            "# Each input is a parameter: set INPUTS in the first cell (a batch sets it for each",
            "# job, in the order of the job's inputs). Inputs of origin (sha256):",
            *(f"#   INPUTS[{i}] {item['path']!r}  {item['sha256']}" for i, item in enumerate(self.inputs)),
            "# Checks the output passed:",
            *(f"#   {out!r}  {digest}" for out, digest in sorted(self.checks.items())),
            *_layout_lines(self.layout),
            *([f"{PACKAGES}{json.dumps(self.packages)}"] if self.packages else []),
        ]  # fmt: skip
        origin = parameters_cell([f"{DATA}/{item['name']}" for item in self.inputs])
        parts = ["\n".join(header), f"{PARAMETERS}\n{origin}"]
        parts += [f"{CELL}\n{code.strip()}" for code in self.cells]
        return "\n\n".join(parts) + "\n"


def _layout_lines(layout: Layout | None) -> list[str]:
    """The header's layout: its key and shape for a person (whitespace, line ends included,
    collapsed: a column name cannot end the comment), then the fingerprint as one JSON line."""
    if layout is None:
        return ["# layout: unknown (the inputs could not be read when it was made)"]
    shape = " ".join(layout.describe().split())
    return [f"# layout {layout.key}: {shape}", f"{FINGERPRINT}{layout.to_json()}"]


def successful_cells(events: list[Event]) -> tuple[list[str], int]:
    """The code of the python cells that ran to their end without an error, after the last
    reset (a reset cleared the kernel: what came before it built nothing that lasted), and how
    many were left out."""
    cells: list[str] = []
    left_out = 0
    for event in events:
        match event:
            case Reset(reason=reason) if reason != "idle":  # idle: serve rebuilds the state
                cells, left_out = [], 0
            case Step():
                for ex in event.executions():
                    if not ex.ok or ex.interrupted:
                        left_out += 1
                    elif ex.code.strip() and not _sets_parameters(ex.code):
                        cells.append(ex.code)
    return cells, left_out


def installed_packages(cells: list[str]) -> list[str]:
    """The requirements the cells' `%pip install` / `!pip install` lines asked for, in order,
    each once: a recipe job installs them (from the wheelhouse) before its cells run."""
    found: list[str] = []
    for code in cells:
        for match in MAGIC.finditer(code):
            found += pip_install_requirements(match.group(2)[1:]) or []
    return list(dict.fromkeys(found))


def _sets_parameters(code: str) -> bool:
    """A recipe's own parameters cell, as a recipe job ran it: not a cell of the next recipe."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    return any(_assigns_inputs(node) for node in body)


def _assigns_inputs(node: ast.stmt) -> TypeGuard[ast.Assign]:
    """`INPUTS = ...`: the statement a parameters cell is known by."""
    return isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
        PARAMETER
    ]


def passed_checks(events: list[Event]) -> dict[str, str] | None:
    """The outputs (path -> sha256) of the run's last check run, when it passed and the
    question it checked was answered; else None."""
    last: ChecksRun | None = None
    answered = False
    for event in events:
        match event:
            case ChecksRun():
                last, answered = event, False
            case Final(stop_reason="answered", question=question) if last is not None:
                answered = last.passed and last.question == question
    if last is None or not answered:
        return None
    return {path: str(verdict.get("sha256")) for path, verdict in last.outputs.items()}


class _InputPaths(cst.CSTTransformer):
    """Every string literal holding an input's path: the whole string becomes INPUTS[i]; a
    path inside a longer string becomes an f-string part (or a concatenation)."""

    def __init__(self, paths: dict[str, int]) -> None:
        self.paths = paths
        alternatives = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
        # /data/a.csv, not /data/a.csv2 nor /workspace/data/a.csv
        self.pattern = re.compile(f"(?<![\\w.-])({alternatives})(?![\\w.-])")
        self.replaced = 0
        self.concatenated = 0  # inside an implicit concatenation ("a" "b")

    def _index(self, path: str) -> cst.Subscript:
        return cst.Subscript(
            cst.Name(PARAMETER),
            [cst.SubscriptElement(cst.Index(cst.Integer(str(self.paths[path]))))],
        )

    def _replaced(self, value: str) -> cst.BaseExpression:
        """The string as INPUTS[i] where it is a path, joined to the rest with +."""
        pieces: list[cst.BaseExpression] = []
        last = 0
        for match in self.pattern.finditer(value):
            if match.start() > last:
                pieces.append(cst.SimpleString(repr(value[last : match.start()])))
            pieces.append(self._index(match[1]))
            last = match.end()
            self.replaced += 1
        if last < len(value):
            pieces.append(cst.SimpleString(repr(value[last:])))
        if len(pieces) == 1:
            return pieces[0]
        joined = pieces[0]
        for piece in pieces[1:]:
            joined = cst.BinaryOperation(joined, cst.Add(), piece)
        # parenthesized, so that `"/data/a.csv x".split()` keeps applying to the whole string
        return joined.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def _path_string(self, node: cst.SimpleString | cst.ConcatenatedString) -> str | None:
        """The string's value when it holds a path (never a bytes literal's), else None."""
        if "b" in getattr(node, "prefix", "").lower():
            return None
        value = node.evaluated_value
        return value if isinstance(value, str) and self.pattern.search(value) else None

    def visit_ConcatenatedString(self, node: cst.ConcatenatedString) -> bool:
        self.concatenated += 1  # its parts cannot become expressions one by one
        return True

    def leave_ConcatenatedString(
        self, original: cst.ConcatenatedString, updated: cst.ConcatenatedString
    ) -> cst.BaseExpression:
        self.concatenated -= 1
        if not _has_fstring(updated) and (value := self._path_string(updated)) is not None:
            return self._replaced(value)
        return updated

    def leave_SimpleString(
        self, original: cst.SimpleString, updated: cst.SimpleString
    ) -> cst.BaseExpression:
        if self.concatenated or (value := self._path_string(updated)) is None:
            return updated
        return self._replaced(value)

    def leave_FormattedStringText(
        self, original: cst.FormattedStringText, updated: cst.FormattedStringText
    ) -> cst.FormattedStringText | cst.FlattenSentinel:
        if not self.pattern.search(updated.value):
            return updated
        parts: list[cst.BaseFormattedStringContent] = []
        last = 0
        for match in self.pattern.finditer(updated.value):
            if match.start() > last:
                parts.append(cst.FormattedStringText(updated.value[last : match.start()]))
            parts.append(cst.FormattedStringExpression(self._index(match[1])))
            last = match.end()
            self.replaced += 1
        if last < len(updated.value):
            parts.append(cst.FormattedStringText(updated.value[last:]))
        return cst.FlattenSentinel(parts)


def _has_fstring(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.ConcatenatedString):
        return _has_fstring(node.left) or _has_fstring(node.right)
    return isinstance(node, cst.FormattedString)


MAGIC = re.compile(r"^(\s*)([%!].*)$", re.M)  # an IPython line magic or shell escape


def plain_python(code: str) -> str | None:
    """The cell as Python a script can hold: IPython's line magics and shell escapes
    (`%matplotlib inline`, `!ls`) commented out; None if it still does not parse."""
    for candidate in (code, MAGIC.sub(r"\1# (IPython, left out of the recipe) \2", code)):
        try:
            ast.parse(candidate)
            return candidate
        except SyntaxError:
            continue
    return None


def parameterize(code: str, inputs: list[dict]) -> str:
    """The cell with each input's /data path replaced by INPUTS[i]. A rewrite that would not
    parse (a path inside an f-string's expression, a `case` pattern) keeps the cell as it
    was: a job then fails on the literal path and the agent takes over."""
    paths = {f"{DATA}/{item['name']}": i for i, item in enumerate(inputs)}
    if not paths:
        return code
    try:
        rewritten = cst.parse_module(code).visit(_InputPaths(paths)).code
        ast.parse(rewritten)
    except (cst.ParserSyntaxError, SyntaxError):
        return code
    return rewritten


def from_run(folder: Path, layout: Layout | None = None) -> Recipe:
    """The recipe of the run (or batch job) in folder, whose outputs passed their checks;
    `layout` is its inputs' (else made from the run's inputs, when they are still there)."""
    trace = folder / "trace.jsonl"
    if not trace.is_file():
        raise RecipeError(f"{folder} holds no trace.jsonl: give a run or batch-job folder")
    try:
        events = read_events(trace)
    except (OSError, ValueError) as error:
        raise RecipeError(f"{trace} cannot be read: {error}") from None
    checks = passed_checks(events)
    if checks is None:
        raise RecipeError(
            f"the run in {folder} has no answer whose outputs passed declared checks: only "
            'such a run makes a recipe (declare them with --expect OUT=SCHEMA or "expect")'
        )
    inputs = all_inputs(events)
    ran, left_out = successful_cells(events)
    cells = [c for c in map(plain_python, ran) if c is not None]
    left_out += len(ran) - len(cells)  # what no script can hold
    if not cells:
        raise RecipeError(
            f"the run in {folder} ran no cell to its end: nothing to make a recipe of"
        )
    recipe = Recipe(
        [parameterize(code, inputs) for code in cells],
        inputs,
        source=str(folder),
        checks=checks,
        left_out=left_out,
        layout=layout or _layout_of(inputs),
        packages=installed_packages(ran),
    )
    try:
        ast.parse(recipe.script())
    except SyntaxError as error:  # a cell parses alone but not in the script (a bug here)
        raise RecipeError(f"the recipe of {folder} does not parse: {error}") from None
    return recipe


def _layout_of(inputs: list[dict]) -> Layout | None:
    paths = [Path(item["path"]) for item in inputs]
    return Layout.of(paths) if all(p.is_file() for p in paths) else None


@dataclass(frozen=True)
class Loaded:
    cells: list[str]  # the cells after the parameters cell
    inputs: int  # how many inputs the parameters cell names
    parameters: str = ""  # that cell as written: a job runs it, then its own INPUTS
    layout: Layout | None = None  # from the header's fingerprint line, when it has one
    made_from: str = ""  # the header's first line's run folder
    packages: tuple[str, ...] = ()  # from the header's packages line: installed first


def _cells(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The header (the lines before the first cell) and the (marker, code) of each `# %%`
    cell, found as comment tokens at the start of a line: a `# %%` inside a string, or inside
    a header line (a column name), is not a cell."""
    lines = text.splitlines(keepends=True)
    starts = [
        token.start[0] - 1
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
        and token.start[1] == 0
        and token.string.startswith("# %%")
    ]
    header = "".join(lines[: starts[0]] if starts else lines)
    cells = [
        (lines[start].strip(), "".join(lines[start + 1 : end]))
        for start, end in zip(starts, [*starts[1:], len(lines)], strict=True)
    ]
    return header, cells


def load(path: Path) -> Loaded:
    """A recipe file: it parses, its first cell sets INPUTS to a list of paths. The errors
    say what is wrong and where."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RecipeError(f"{path} cannot be read: {error}") from None
    try:
        ast.parse(text, filename=str(path))
    except SyntaxError as error:
        raise RecipeError(f"{path} does not parse: line {error.lineno}: {error.msg}") from None
    header, cells = _cells(text)
    if not cells or cells[0][0] != PARAMETERS:
        raise RecipeError(f"{path}: the first cell must be the parameters cell `{PARAMETERS}`")
    parameters = cells[0][1].strip()
    count = _inputs_count(parameters, path)
    layout = _header_layout(header, path)
    code = [c.strip() for _, c in cells[1:] if c.strip()]
    packages = _header_packages(header, path)
    return Loaded(code, count, parameters, layout, _made_from(header), packages)


def _header_packages(header: str, path: Path) -> tuple[str, ...]:
    """The packages line's requirements, each one a requirement and nothing else (a job
    passes them to pip)."""
    for line in header.splitlines():
        if line.startswith(PACKAGES):
            try:
                found = json.loads(line[len(PACKAGES) :])
            except ValueError:
                found = None
            if not isinstance(found, list) or not all(
                isinstance(r, str) and REQUIREMENT.fullmatch(r) for r in found
            ):
                raise RecipeError(f"{path}: its packages line is not a list of requirements")
            return tuple(found)
    return ()


def _header_layout(header: str, path: Path) -> Layout | None:
    for line in header.splitlines():
        if line.startswith(FINGERPRINT):
            try:
                return Layout.from_json(line[len(FINGERPRINT) :])
            except (ValueError, KeyError, TypeError) as error:
                raise RecipeError(
                    f"{path}: its fingerprint line is not a layout ({error})"
                ) from None
    return None


def _made_from(header: str) -> str:
    first = header.splitlines()[0] if header.strip() else ""
    found = re.search(r"made from the run in (.+)$", first)
    if not found:
        return ""
    try:
        return str(ast.literal_eval(found[1]))
    except (ValueError, SyntaxError):
        return ""


def _inputs_count(cell: str, path: Path) -> int:
    for node in ast.parse(cell).body:
        if _assigns_inputs(node) and isinstance(node.value, ast.List | ast.Tuple):
            return len(node.value.elts)
    raise RecipeError(f"{path}: the parameters cell must set {PARAMETER} = [...] (a list of paths)")


def parameters_cell(paths: list[str], written: str = "") -> str:
    """The first cell a job runs: the recipe's parameters cell as written (other parameters a
    person added stay), then the job's own inputs, in the order of its jobs-file entry."""
    own = f"{PARAMETER} = {paths!r}"
    return f"{written}\n{own}" if written.strip() else own
