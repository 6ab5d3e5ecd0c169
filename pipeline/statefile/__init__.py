"""Loading and validating state files.

The YAML is read with ruamel's round-trip loader only to learn where each key and
value stands; it is then turned into plain JSON data plus a table of positions,
so jsonschema and the reconcilers never see ruamel types. Every problem becomes one
`FILE:LINE:COL: message` line (1-based, as gcc, ruff and yamllint print them).

A file that validated once is cached by the hash of its bytes and of the schema:
`diff` on an unchanged state file imports neither ruamel.yaml nor jsonschema.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import ID_PREFIXES, REGISTRY, reconciler_for

try:  # the builtin SHA-256: `import hashlib` loads OpenSSL, ~10 ms of every start-up
    from _sha256 import sha256
except ImportError:  # Python >= 3.12 renamed it
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256
from .base import Reconciler, Resource

SUPPORTED_VERSIONS = (1,)
# Paths as strings: pathlib (with urllib.parse and ipaddress) is ~10 ms of every start-up.
SCHEMA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "schema")

# Rank of each kind when `needs` says nothing: units, then gpus, then mounts, then extractions.
DEFAULT_RANK = {"units": 10, "gpus": 20, "mounts": 30, "extractions": 40}


class StateFileError(Exception):
    """One or more problems, each already formatted as `file:line:col: message`."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# --- units of measure -----------------------------------------------------------------

_SIZE_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B|B)?\s*$", re.IGNORECASE)
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
# systemd's own rules (unit_name_is_valid): a name, an optional @instance, a known suffix.
_UNIT_RE = re.compile(
    r"^[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?"
    r"\.(service|socket|target|timer|mount|automount|swap|path|slice|scope|device)$"
)


def parse_size(value: int | str) -> int:
    """'4TiB' -> bytes. Integers are bytes. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(value)
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(value)
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").upper()])


def parse_size_or_percent(value: int | str) -> tuple[str, float]:
    """('bytes', n) or ('percent', p)."""
    if isinstance(value, str):
        m = _PERCENT_RE.match(value)
        if m:
            pct = float(m.group(1))
            if pct > 100:
                raise ValueError(value)
            return ("percent", pct)
    return ("bytes", parse_size(value))


def parse_duration(value: int | float | str) -> float:
    """'1h30m' -> 5400.0 seconds; a bare number is seconds. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(value)
        return float(value)
    text = str(value).strip()
    if not _DURATION_RE.match(text):
        raise ValueError(value)
    return sum(float(n) * _DURATION_SECONDS[u] for n, u in _DURATION_PART.findall(text))


def is_unit_name(name: str) -> bool:
    return len(name) <= 255 and bool(_UNIT_RE.match(name))


def format_bytes(n: float) -> str:
    for unit, size in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{int(n)}B"


def format_duration(seconds: float) -> str:
    if 0 < seconds < 1:
        return f"{round(seconds * 1000)}ms"  # a sub-second deadline is not "0s"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


# --- the schema -----------------------------------------------------------------------

_SCHEMA_CACHE: dict[str, Any] = {}


def bundled_schema() -> dict[str, Any]:
    """state.schema.json with each registered kind's fragment under $defs and properties."""
    if "bundle" not in _SCHEMA_CACHE:
        schema = _read_json(os.path.join(SCHEMA_DIR, "state.schema.json"))
        for key in REGISTRY:
            fragment = _read_json(os.path.join(SCHEMA_DIR, "kinds", f"{key}.schema.json"))
            fragment.pop("$schema", None)
            schema["$defs"][key] = fragment
            schema["properties"][key] = {"$ref": f"#/$defs/{key}"}
        _SCHEMA_CACHE["bundle"] = schema
    return _SCHEMA_CACHE["bundle"]


def _schema_fingerprint() -> str:
    """What a cached verdict depends on: the files bundled_schema() reads (not the report or
    inventory schemas, nor the generated bundle), the registered kinds and reconcile's version
    (the checks done in code, such as `needs`, change with it)."""
    from .. import __version__

    h = sha256(__version__.encode())
    for path in [os.path.join(SCHEMA_DIR, "state.schema.json"),
                 *(os.path.join(SCHEMA_DIR, "kinds", f"{k}.schema.json") for k in REGISTRY)]:
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    h.update(",".join(sorted(REGISTRY)).encode())
    return h.hexdigest()


def _format_checker():
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())

    def returns_bool(fn):
        def check(value):
            try:
                fn(value)
            except (ValueError, TypeError):
                return False
            return True

        return check

    checker.checks("size")(returns_bool(parse_size))
    checker.checks("size-or-percent")(returns_bool(parse_size_or_percent))
    checker.checks("duration")(returns_bool(parse_duration))
    checker.checks("unit-name")(lambda v: not isinstance(v, str) or is_unit_name(v))
    checker.checks("abs-path")(lambda v: not isinstance(v, str) or v.startswith("/"))
    return checker


_FORMAT_HINTS = {
    "size": "invalid size {v!r}: use a number with a unit such as 512MiB, 4TiB or 75.8GB",
    "size-or-percent": "invalid size {v!r}: use e.g. 4TiB, 75.8GB or a percentage such as '15%'",
    "duration": "invalid duration {v!r}: use e.g. 500ms, 10s, 5m or 1h30m",
    "unit-name": "invalid systemd unit name {v!r}: expected NAME.service, NAME.timer, NAME@INSTANCE.service, ...",
    "abs-path": "{v!r} is not an absolute path",
}


# --- YAML with positions ---------------------------------------------------------------

Position = tuple[int, int]  # 1-based line, column


@dataclass
class _Positions:
    """Where each value (and each mapping key) of the document stands."""

    values: dict[tuple, Position] = field(default_factory=dict)
    keys: dict[tuple, Position] = field(default_factory=dict)

    def of_value(self, path: Iterable) -> Position:
        path = tuple(path)
        while path and path not in self.values:
            path = path[:-1]
        return self.values.get(path, (1, 1))

    def of_key(self, path: Iterable) -> Position:
        path = tuple(path)
        return self.keys.get(path) or self.of_value(path)


def _plain(node: Any, path: tuple, pos: _Positions) -> Any:
    """ruamel round-trip nodes -> plain JSON data, recording positions on the way."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap):
        out = {}
        for key in node:
            kline, kcol = node.lc.key(key)
            vline, vcol = node.lc.value(key)
            child = (*path, str(key))
            pos.keys[child] = (kline + 1, kcol + 1)
            pos.values[child] = (vline + 1, vcol + 1)
            out[str(key)] = _plain(node[key], child, pos)
        return out
    if isinstance(node, CommentedSeq):
        out_list = []
        for i, item in enumerate(node):
            line, col = node.lc.item(i)
            pos.values[(*path, i)] = (line + 1, col + 1)
            out_list.append(_plain(item, (*path, i), pos))
        return out_list
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    # Dates, binary and other YAML types have no place in a state file: keep them as text
    # so the schema rejects them with a readable message.
    return str(node)


def _parse_yaml(text: str, label: str) -> tuple[Any, _Positions]:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        doc = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or "invalid YAML"
        if type(exc).__name__ == "DuplicateKeyError":
            m = re.search(r'duplicate key "([^"]*)"', problem)
            problem = f"duplicate key {m.group(1)!r}" if m else problem
            if exc.context_mark is not None:
                problem += f" (first defined at line {exc.context_mark.line + 1})"
        raise StateFileError([f"{label}:{line}:{col}: {problem}"]) from None
    except YAMLError as exc:
        raise StateFileError([f"{label}:1:1: invalid YAML: {str(exc).splitlines()[0]}"]) from None
    pos = _Positions()
    return _plain(doc, (), pos), pos


# --- validation ------------------------------------------------------------------------

def _dotted(path: Iterable) -> str:
    parts = []
    for p in path:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif re.fullmatch(r"[A-Za-z0-9_-]+", p):
            parts.append(("." if parts else "") + p)
        else:
            parts.append(("." if parts else "") + json.dumps(p))
    return "".join(parts)


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
               dict: "mapping", type(None): "null"}


def _message_for(error: Any, doc_pos: _Positions) -> tuple[Position, str]:
    """One jsonschema error -> (position, readable message)."""
    path = tuple(error.absolute_path)
    where = _dotted(path)
    prefix = f"{where}: " if where else ""
    v = error.validator
    if v == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extras = [k for k in error.instance if k not in allowed]
        key = extras[0] if extras else "?"
        import difflib  # only when there is an error to explain

        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else (f" (expected one of: {', '.join(allowed)})"
                                                              if allowed else "")
        return doc_pos.of_key((*path, key)), f"{prefix}unknown key {key!r}{hint}"
    if v == "format" and "propertyNames" in error.relative_schema_path:
        return doc_pos.of_key((*path, error.instance)), _FORMAT_HINTS[error.validator_value].format(
            v=error.instance)
    if v == "format":
        return doc_pos.of_value(path), prefix + _FORMAT_HINTS[error.validator_value].format(v=error.instance)
    if v == "required":
        m = re.match(r"'([^']*)'", error.message)
        missing = m.group(1) if m else error.message
        return doc_pos.of_value(path), f"{prefix}missing required key {missing!r}"
    if v == "type":
        want = error.validator_value
        want = " or ".join(want) if isinstance(want, list) else want
        have = _JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
        want = {"object": "mapping", "array": "list"}.get(want, want)
        return doc_pos.of_value(path), f"{prefix}expected {want}, got {have} {json.dumps(error.instance)}"
    if v == "enum":
        choices = ", ".join(json.dumps(c) for c in error.validator_value)
        return doc_pos.of_value(path), f"{prefix}expected one of {choices}; got {json.dumps(error.instance)}"
    if v in ("oneOf", "anyOf") and error.context:
        import jsonschema.exceptions

        return _message_for(jsonschema.exceptions.best_match(error.context), doc_pos)
    if v == "pattern" and "propertyNames" in error.relative_schema_path:
        return doc_pos.of_key((*path, error.instance)), f"{prefix}invalid name {error.instance!r}"
    message = error.schema.get("errorMessage")
    if message:
        return doc_pos.of_value(path), prefix + message.format(v=error.instance)
    return doc_pos.of_value(path), prefix + error.message


@dataclass(frozen=True)
class LoadedState:
    path: str
    version: int
    host: str | None
    doc: dict[str, Any]
    resources: tuple[Resource, ...]  # in the order they are reconciled

    @property
    def by_id(self) -> dict[str, Resource]:
        return {r.id: r for r in self.resources}


def _cache_dir() -> str:
    explicit = os.environ.get("RECONCILE_CACHE_DIR")
    if explicit:
        return explicit
    if os.geteuid() == 0:
        return "/var/cache/reconcile"
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "reconcile")


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _cache_read(digest: str) -> dict | None:
    try:
        return _read_json(os.path.join(_cache_dir(), "validated", f"{digest}.json"))
    except (OSError, ValueError):
        return None


def _cache_write(digest: str, doc: dict) -> None:
    # Best effort: a read-only cache only costs speed.
    from .atomic import write_json

    try:
        write_json(os.path.join(_cache_dir(), "validated", f"{digest}.json"), doc)
    except OSError:
        pass


def build_resources(doc: dict[str, Any],
                    on_kind: Callable[[Reconciler, list[Resource]], None] | None = None) -> list[Resource]:
    """Every declared resource, kind by kind in REGISTRY order; `on_kind(reconciler, resources)`
    is called as each kind is built (engine.Prefetch starts observing it there)."""
    resources: list[Resource] = []
    for key in REGISTRY:
        if key in doc and doc[key] is not None:
            rec = reconciler_for(key)
            built = rec.resources(doc[key])
            if on_kind is not None:
                on_kind(rec, built)
            resources.extend(built)
    return resources


def order_resources(resources: list[Resource]) -> list[Resource]:
    """Topological order by `needs`; ties broken by kind rank, then declaration order.
    Assumes needs were checked (known, acyclic)."""
    index = {r.id: i for i, r in enumerate(resources)}
    rank = {r.id: (DEFAULT_RANK.get(ID_PREFIXES.get(r.kind, r.kind), 99), index[r.id]) for r in resources}
    pending = {r.id: {n for n in r.needs if n in index} for r in resources}
    by_id = {r.id: r for r in resources}
    ordered: list[Resource] = []
    while pending:
        ready = sorted((rid for rid, deps in pending.items() if not deps), key=rank.__getitem__)
        if not ready:  # a cycle; validation reports it, here keep going in rank order
            ready = sorted(pending, key=rank.__getitem__)[:1]
        rid = ready[0]
        ordered.append(by_id[rid])
        del pending[rid]
        for deps in pending.values():
            deps.discard(rid)
    return ordered


def _check_needs(resources: list[Resource], label: str, pos: _Positions, paths: dict[str, tuple]) -> list[str]:
    problems = []
    ids = [r.id for r in resources]
    for r in resources:
        for i, need in enumerate(r.needs):
            if need not in ids:
                import difflib

                close = difflib.get_close_matches(need, ids, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                line, col = pos.of_value((*paths[r.id], "needs", i))
                problems.append(f"{label}:{line}:{col}: {r.id} needs unknown resource {need!r}{hint}")
            elif need == r.id:
                line, col = pos.of_value((*paths[r.id], "needs", i))
                problems.append(f"{label}:{line}:{col}: {r.id} needs itself")
    # Cycles: depth-first search over known edges.
    graph = {r.id: [n for n in r.needs if n in ids and n != r.id] for r in resources}
    state: dict[str, int] = {}
    reported: set[frozenset] = set()

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                key = frozenset(cycle)
                if key not in reported:
                    reported.add(key)
                    first = cycle[0]
                    idx = list(next(r for r in resources if r.id == first).needs).index(cycle[1])
                    line, col = pos.of_value((*paths[first], "needs", idx))
                    problems.append(f"{label}:{line}:{col}: needs form a cycle: {' -> '.join(cycle)}")
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for r in resources:
        if r.id not in state:
            visit(r.id, [r.id])
    return problems


def validate_text(text: str, label: str) -> dict[str, Any]:
    """Full validation with positions. Returns the plain document or raises StateFileError."""
    data, pos = _parse_yaml(text, label)
    if data is None:
        raise StateFileError([f"{label}:1:1: empty state file: expected a mapping starting with 'version: 1'"])
    if not isinstance(data, dict):
        line, col = pos.of_value(())
        raise StateFileError([f"{label}:{line}:{col}: expected a mapping at the top level, got "
                              f"{_JSON_TYPES.get(type(data), 'a scalar')}"])
    if "version" in data and data["version"] not in SUPPORTED_VERSIONS:
        line, col = pos.of_value(("version",))
        known = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise StateFileError([f"{label}:{line}:{col}: unsupported state file version "
                              f"{json.dumps(data['version'])} (this reconcile reads version {known})"])

    import jsonschema

    validator = jsonschema.Draft202012Validator(bundled_schema(), format_checker=_format_checker())
    found = [_message_for(e, pos) for e in validator.iter_errors(data)]
    if found:
        found.sort()
        seen, problems = set(), []
        for (line, col), msg in found:
            text_line = f"{label}:{line}:{col}: {msg}"
            if text_line not in seen:
                seen.add(text_line)
                problems.append(text_line)
        raise StateFileError(problems)

    resources = build_resources(data)
    paths = {}
    for key in REGISTRY:
        section = data.get(key)
        if isinstance(section, dict):
            for r in resources:
                if ID_PREFIXES.get(r.kind) == key:
                    paths[r.id] = (key,) if r.id == key else (key, r.name)
    problems = _check_needs(resources, label, pos, paths)
    if problems:
        raise StateFileError(problems)
    return data


def load(path: str | os.PathLike, *, text: str | bytes | None = None, use_cache: bool = True,
         on_kind: Callable[[Reconciler, list[Resource]], None] | None = None) -> LoadedState:
    """Read, validate (or trust the cache) and build the ordered resources. `text` (bytes: checked as
    UTF-8 with a position) stands in for the file's content, labelled `path` (a state sent on stdin)."""
    label = str(path)
    if text is None:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            raise StateFileError([f"{label}:1:1: no such file"]) from None
        except IsADirectoryError:
            raise StateFileError([f"{label}:1:1: is a directory, not a state file"]) from None
        except OSError as exc:
            raise StateFileError([f"{label}:1:1: cannot read: {exc.strerror}"]) from None
    else:
        raw = text.encode() if isinstance(text, str) else text
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise StateFileError([f"{label}:{line}:{col}: not UTF-8 text"]) from None

    digest = sha256(_schema_fingerprint().encode() + b"\0" + raw).hexdigest()
    doc = _cache_read(digest) if use_cache else None
    if doc is None:
        doc = validate_text(text, label)
        if use_cache:
            _cache_write(digest, doc)
    resources = order_resources(build_resources(doc, on_kind))
    return LoadedState(path=label, version=doc["version"], host=doc.get("host"), doc=doc,
                       resources=tuple(resources))
