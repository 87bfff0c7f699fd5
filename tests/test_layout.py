"""The house plan (README's Layout), read from the code with `ast`, imports inside functions
included, so later work cannot quietly undo it: the image's sources at the root; batch work in
agent/jobs/; every import runs downwards (front ends -> jobs -> the agent core with its model
and records wings -> tools -> sandbox); one class name per concept; no function over 60
lines."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sandbox", "agent", "tools")
MAX_FUNCTION_LINES = 60


def modules(folder: str) -> dict[str, ast.Module]:
    """Every module under ROOT/folder by its dotted name, parsed."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return found


CODE = {name: tree for package in PACKAGES for name, tree in modules(package).items()}


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
    """sandbox, tools, agent (the core: modules directly in agent/) or agent.<wing>."""
    parts = module.split(".")
    if parts[0] == "agent" and len(parts) > 1 and parts[1] in AGENT_WINGS:
        return f"agent.{parts[1]}"
    return parts[0]


def test_the_image_sources_are_at_the_root():
    assert (ROOT / "images" / "Dockerfile").is_file()
    assert not (ROOT / "sandbox" / "image").exists()


def test_batch_work_lives_in_agent_jobs():
    for name in ("batch.py", "ray_batch.py", "jobfiles.py", "recipe.py"):
        assert not (ROOT / "agent" / name).exists(), f"agent/{name} belongs in agent/jobs/"
    for name in ("batch.py", "ray_batch.py", "recipe_maker.py", "recipe_runner.py"):
        assert (ROOT / "agent" / "jobs" / name).is_file()


CORE_WINGS = ("agent.model", "agent.records")  # the core's own wings, below jobs
ABOVE_CORE = ("agent.jobs", "agent.hosting", "agent.cli", "agent.serve", "agent.mcp")


def test_imports_run_downwards():
    wrong = []
    for module in CODE:
        wing = wing_of(module)
        if module.startswith("sandbox"):
            above = ("agent", "tools")
        elif module.startswith("tools"):
            above = ("agent",)
        elif wing == "agent" or wing in CORE_WINGS:  # agent/*.py, agent/model, agent/records
            above = ABOVE_CORE
        elif wing == "agent.jobs":
            above = ("agent.hosting", "agent.cli", "agent.serve", "agent.mcp")
        elif wing == "agent.hosting":
            above = ("agent.jobs", "agent.cli", "agent.serve", "agent.mcp")
        elif wing == "agent.serve":
            above = ("agent.cli", "agent.mcp")
        elif wing == "agent.mcp":
            above = ("agent.cli", "agent.serve")
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
    assert "agent.session" in CODE and "agent.jobs.batch" in CODE and "images" not in CODE
    assert "agent.output_checks" in imported(CODE["agent.session"], "agent.session")
    assert reaches("agent.cli.serve", ("agent.hosting",))  # an import inside a function counts
    assert reaches("agent.jobs.batch", ("agent.session",))
    assert wing_of("agent.session") == "agent" and wing_of("agent.jobs.batch") == "agent.jobs"
    assert {"model", "records", "jobs", "hosting", "cli", "serve", "mcp"} <= AGENT_WINGS
