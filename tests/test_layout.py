"""The house plan (README's Layout), read from the code with `ast`, imports inside functions
included, so later work cannot quietly undo it: the image's sources at the root; batch work in
agent/jobs/; every import runs downwards (front ends -> jobs -> the agent core with its model
and records wings -> tools -> sandbox); one class name per concept; no function over 60
lines."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sandbox", "agent", "tools")  # each installs as sandcell.<folder>
MAX_FUNCTION_LINES = 60


def modules(folder: str, package: str = "sandcell") -> dict[str, ast.Module]:
    """Every module under ROOT/folder by its dotted import name, parsed."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        name = ".".join([package, *parts] if package else parts)
        found[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return found


CODE = {name: tree for package in PACKAGES for name, tree in modules(package).items()}
BARE = ("agent", "sandbox", "tools", "images")  # the folders' names, never import names


def imported(tree: ast.Module, module: str) -> set[str]:
    """Every module an import anywhere in the tree names (in functions too), absolute."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                package = module.split(".")[: -node.level] if node.level else []
                base = ".".join([*package, base] if base else package)
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}  # `from agent import x`
    return names


def reaches(module: str, wings: tuple[str, ...]) -> set[str]:
    """The imports of `module` that land in one of `wings` (a package and what is under it)."""
    return {
        name
        for name in imported(CODE[module], module)
        if any(name == wing or name.startswith(wing + ".") for wing in wings)
    }


AGENT_WINGS = {p.name for p in (ROOT / "agent").iterdir() if (p / "__init__.py").is_file()}


def wing_of(module: str) -> str:
    """sandcell.sandbox, .tools, .agent (the core: modules directly in agent/) or .agent.<wing>."""
    parts = module.split(".")[1:]  # after "sandcell."
    if parts[0] == "agent" and len(parts) > 1 and parts[1] in AGENT_WINGS:
        return f"sandcell.agent.{parts[1]}"
    return f"sandcell.{parts[0]}"


def test_the_image_sources_are_at_the_root():
    assert (ROOT / "images" / "Dockerfile").is_file()
    assert not (ROOT / "sandbox" / "image").exists()


def test_batch_work_lives_in_agent_jobs():
    for name in ("batch.py", "ray_batch.py", "jobfiles.py", "recipe.py"):
        assert not (ROOT / "agent" / name).exists(), f"agent/{name} belongs in agent/jobs/"
    for name in ("batch.py", "ray_batch.py", "recipe_maker.py", "recipe_runner.py"):
        assert (ROOT / "agent" / "jobs" / name).is_file()


CORE_WINGS = ("sandcell.agent.model", "sandcell.agent.records")  # the core's own wings, below jobs
ABOVE_CORE = (
    "sandcell.agent.jobs",
    "sandcell.agent.hosting",
    "sandcell.agent.cli",
    "sandcell.agent.serve",
    "sandcell.agent.mcp",
)


def test_imports_run_downwards():
    wrong = []
    for module in CODE:
        wing = wing_of(module)
        if module.startswith("sandcell.sandbox"):
            above = ("sandcell.agent", "sandcell.tools")
        elif module.startswith("sandcell.tools"):
            above = ("sandcell.agent",)
        elif (
            wing == "sandcell.agent" or wing in CORE_WINGS
        ):  # agent/*.py, agent/model, agent/records
            above = ABOVE_CORE
        elif wing == "sandcell.agent.jobs":
            above = (
                "sandcell.agent.hosting",
                "sandcell.agent.cli",
                "sandcell.agent.serve",
                "sandcell.agent.mcp",
            )
        elif wing == "sandcell.agent.hosting":
            above = (
                "sandcell.agent.jobs",
                "sandcell.agent.cli",
                "sandcell.agent.serve",
                "sandcell.agent.mcp",
            )
        elif wing == "sandcell.agent.serve":
            above = ("sandcell.agent.cli", "sandcell.agent.mcp")
        elif wing == "sandcell.agent.mcp":
            above = ("sandcell.agent.cli", "sandcell.agent.serve")
        else:  # agent.cli: the front end over everything
            continue
        wrong += [f"{module} imports {name}" for name in sorted(reaches(module, above))]
    assert wrong == []


def test_each_class_name_is_defined_once():
    where = defaultdict(list)
    for module, tree in CODE.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(module)
    assert {name: found for name, found in where.items() if len(found) > 1} == {}


def test_no_function_is_over_60_lines():
    long = []
    for module, tree in CODE.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert long == []


def test_the_checks_see_what_they_should():
    """The readers above find what they look for (a broken walk would pass everything)."""
    assert (
        "sandcell.agent.session" in CODE
        and "sandcell.agent.jobs.batch" in CODE
        and "images" not in CODE
    )
    assert "sandcell.agent.output_checks" in imported(
        CODE["sandcell.agent.session"], "sandcell.agent.session"
    )
    assert reaches(
        "sandcell.agent.cli.serve", ("sandcell.agent.hosting",)
    )  # an import inside a function counts
    assert reaches("sandcell.agent.jobs.batch", ("sandcell.agent.session",))
    assert (
        wing_of("sandcell.agent.session") == "sandcell.agent"
        and wing_of("sandcell.agent.jobs.batch") == "sandcell.agent.jobs"
    )
    assert {"model", "records", "jobs", "hosting", "cli", "serve", "mcp"} <= AGENT_WINGS


def test_nothing_imports_a_bare_folder_name():
    """`import agent` (or sandbox, tools, images) would load a module a second time under a
    second name, with a second set of classes, or another project's package of that name."""
    wrong = []
    for folder in (*PACKAGES, "images", "src", "tests", "bench", "scripts"):
        for name, tree in modules(folder, package="").items():
            for imported_name in imported(tree, name):
                if imported_name.split(".")[0] in BARE:
                    wrong.append(f"{name} imports {imported_name}")
    assert wrong == []
    assert "agent.loop" in imported(ast.parse("from agent.loop import Loop"), "x")  # it can fail
