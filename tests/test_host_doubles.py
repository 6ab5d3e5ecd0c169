"""Every test double of a machine implements the one Host interface (core/host.py) with its own
signatures: a double that drifts from the interface would let a kind's test pass against a host
that no real one resembles. Read with `ast`, so a double is checked whether or not its test runs."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from host_doubles import ScriptedHost
from reconcile_host.core.host import Host
from reconcile_host.local.host import LocalHost

TESTS = Path(__file__).resolve().parent
MEMBERS = {name for name, v in vars(Host).items() if inspect.isfunction(v) and not name.startswith("_")}


def _params(fn) -> list[tuple[str, str]]:
    sig = inspect.signature(fn)
    return [(p.name, repr(p.default)) for p in sig.parameters.values()]


def _ast_params(fn: ast.FunctionDef) -> list[tuple[str, str]]:
    a = fn.args
    plain = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(plain) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, "<empty>" if d is None else repr(ast.literal_eval(d))) for p, d in zip(plain, defaults, strict=True)]
    if a.vararg:
        out.append((a.vararg.arg, "<empty>"))
    return out


def _want(name: str) -> list[tuple[str, str]]:
    return [(n, "<empty>" if d == repr(inspect.Parameter.empty) else d) for n, d in _params(getattr(Host, name))]


def test_the_implementations_are_hosts():
    for cls in (LocalHost, ScriptedHost):
        assert isinstance(cls(), Host)
        for name in MEMBERS:
            assert _params(getattr(cls, name)) == _params(getattr(Host, name)), f"{cls.__name__}.{name}"


def test_every_double_in_the_tests_has_the_interfaces_signatures():
    doubles, wrong = [], []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            double = bases & {"ScriptedHost", "LocalHost"} or node.name.endswith("Host")
            if path.name == "host_doubles.py" or not double:
                continue
            doubles.append(f"{path.name}:{node.name}")
            if not bases - {"object"}:
                wrong.append(f"{path.name}:{node.name} is not built on ScriptedHost or LocalHost")
            for name in MEMBERS & set(methods):
                if _ast_params(methods[name]) != _want(name):
                    wrong.append(f"{path.name}:{node.name}.{name}{_ast_params(methods[name])} != {_want(name)}")
    assert len(doubles) >= 6, doubles  # the guard: the scan found the doubles
    assert not wrong, "\n".join(wrong)
