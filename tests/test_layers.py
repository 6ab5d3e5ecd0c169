"""The house rules of docs/design.md, checked on the code: which layer may import which, no
import cycles, no module over ~600 lines.

Imports are read with `ast` from every module of the package, at the top and inside functions
(a lazy import is still a dependency), except those under `if TYPE_CHECKING:` (types only,
never run). Relative imports are resolved to module names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = "reconcile_host"
MAX_LINES = 600

# (layer, module names or prefixes ending in "."); the first match wins, so the floor's modules
# come before the rest of pipeline/ and machines/host before the other doors.
LAYERS = [
    ("floor", [PKG, f"{PKG}.pipeline", f"{PKG}.pipeline.contract", f"{PKG}.pipeline.values",
               f"{PKG}.pipeline.paths", f"{PKG}.pipeline.atomic", f"{PKG}.schema"]),
    ("host", [f"{PKG}.machines.host"]),
    ("kinds", [f"{PKG}.reconcilers", f"{PKG}.reconcilers."]),
    ("pipeline", [f"{PKG}.pipeline."]),
    ("views", [f"{PKG}.views", f"{PKG}.views."]),
    ("doors", [f"{PKG}.machines", f"{PKG}.machines."]),
    ("cli", [f"{PKG}.cli", f"{PKG}.commands", f"{PKG}.__main__"]),
]
# What each layer may import besides itself (docs/design.md, "The layers").
MAY_IMPORT = {
    "floor": set(),
    "host": {"floor"},
    "kinds": {"floor"},
    "pipeline": {"floor", "host", "registry"},
    "views": {"floor", "pipeline"},
    "doors": {"floor", "host", "pipeline", "views"},
    "cli": {"floor", "host", "registry", "pipeline", "views", "doors"},
}
REGISTRY = f"{PKG}.reconcilers"  # the one module of the kinds' layer the pipeline may name


def layer_of(module: str) -> str:
    for layer, names in LAYERS:
        for name in names:
            if module == name or (name.endswith(".") and module.startswith(name)):
                return layer
    raise AssertionError(f"{module}: in no layer of docs/design.md")


def modules() -> dict[str, Path]:
    """The package's modules: the root's (but setup.py) and those of the layers' folders."""
    found = {}
    paths = [p for p in ROOT.glob("*.py") if p.name != "setup.py"]
    for folder in ("pipeline", "reconcilers", "machines", "views", "schema"):
        paths += (ROOT / folder).rglob("*.py")
    for path in sorted(paths):
        rel = path.relative_to(ROOT)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([PKG, *parts])] = path
    return found


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that `module` imports when it runs."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:  # `from .x import name`: name may be a symbol, not a module
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
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
    assert {f"{PKG}.cli", f"{PKG}.pipeline.engine", f"{PKG}.reconcilers.units", f"{PKG}.machines.remote",
            f"{PKG}.views.junit", f"{PKG}.reconcilers.extractions.listing"} <= set(GRAPH)
    assert f"{PKG}.pipeline.contract" in GRAPH[f"{PKG}.pipeline.engine"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_module_imports_only_what_its_layer_may(module):
    mine = layer_of(module)
    wrong = []
    for target in sorted(GRAPH[module]):
        theirs = "registry" if target == REGISTRY and mine != "kinds" else layer_of(target)
        if theirs != mine and theirs not in MAY_IMPORT[mine]:
            wrong.append(f"{target} ({theirs})")
    assert not wrong, f"{module} ({mine}) imports {', '.join(wrong)}"


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
