"""The house rules of docs/design.md, checked on the code: the folders are the layers and imports
only go down them, no import cycle of any kind, no module over ~600 lines.

Imports are read with `ast` from every module of the package, at the top, inside functions (a
lazy import is still a dependency) and under `if TYPE_CHECKING:` (a type-only import is still a
dependency: it is how the last cycle hid). Relative imports are resolved to module names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = "reconcile_host"
MAX_LINES = 600

# The layers from the bottom up: a folder each (the command line: the root's modules). A module
# may import its own layer and those below it, nothing above (docs/design.md, "The layers").
FOLDERS = ["core", "local", "common", "reconcilers", "pipeline", "views", "doors"]
LAYERS = ["core", "local", "common", "kinds", "pipeline", "views", "doors", "cli"]
LAYER_OF_FOLDER = dict(zip(FOLDERS, LAYERS, strict=False))
# Plain data read by the pipeline (the JSON Schemas) and the package's own root (its version).
BOTTOM = {f"{PKG}.schema", PKG}
# Above the kinds, only their registry is named: it imports a kind when a state declares it.
REGISTRY = f"{PKG}.reconcilers"


def layer_of(module: str) -> str:
    if module in BOTTOM:
        return "core"
    parts = module.split(".")
    if len(parts) == 2 and parts[1] in ("cli", "commands", "__main__"):
        return "cli"
    if len(parts) >= 2 and parts[1] in LAYER_OF_FOLDER:
        return LAYER_OF_FOLDER[parts[1]]
    raise AssertionError(f"{module}: in no layer of docs/design.md")


def modules() -> dict[str, Path]:
    """The package's modules: the root's (but setup.py) and those of the layers' folders."""
    found = {}
    paths = [p for p in ROOT.glob("*.py") if p.name != "setup.py"]
    for folder in (*FOLDERS, "schema"):
        paths += (ROOT / folder).rglob("*.py")
    for path in sorted(paths):
        rel = path.relative_to(ROOT)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([PKG, *parts])] = path
    return found


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `module` imports, type-only imports included."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:  # `from .x import name`: name may be a symbol, not a module
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PKG and (target := resolve(alias.name)):
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            if stem.split(".")[0] == PKG:
                for alias in node.names:
                    if target := resolve(f"{stem}.{alias.name}"):
                        out.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    out.discard(module)
    return out


GRAPH = {m: imports_of(m, p, set(modules())) for m, p in modules().items()}


def test_the_package_is_read_whole():
    # A guard for the checks below: the layers and their modules are all there.
    assert {f"{PKG}.cli", f"{PKG}.pipeline.engine", f"{PKG}.reconcilers.units", f"{PKG}.doors.remote",
            f"{PKG}.views.junit", f"{PKG}.reconcilers.extractions.listing"} <= set(GRAPH)
    assert f"{PKG}.core.contract" in GRAPH[f"{PKG}.pipeline.engine"]


def test_every_folder_is_a_layer():
    # A new folder of code is a decision about the house: it gets a row in FOLDERS first.
    code_dirs = {p.parent.relative_to(ROOT).parts[0] for p in ROOT.glob("*/__init__.py")}
    assert code_dirs - {"tests", "bench", "contrib", "states", "docs"} == set(FOLDERS) | {"schema"}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_module_imports_only_what_its_layer_may(module):
    mine = LAYERS.index(layer_of(module))
    wrong = []
    for target in sorted(GRAPH[module]):
        theirs = LAYERS.index(layer_of(target))
        if theirs > mine:
            wrong.append(f"{target} ({LAYERS[theirs]}, above {LAYERS[mine]})")
        elif LAYERS[theirs] == "kinds" and LAYERS[mine] != "kinds" and target != REGISTRY:
            wrong.append(f"{target} (a kind: name the registry, {REGISTRY})")
    assert not wrong, f"{module} ({LAYERS[mine]}) imports {', '.join(wrong)}"


def test_no_import_cycles():
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    # A package's __init__ importing its own submodule and that submodule importing a sibling
    # through the package is still a cycle: nothing is excused.
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_over_600_lines(module):
    lines = len(modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


def test_bench_modules_are_small_too():
    for path in sorted((ROOT / "bench").glob("*.py")):
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines"
