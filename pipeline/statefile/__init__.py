"""Loading and validating state files.

The YAML is read with ruamel's round-trip loader only to learn where each key and value
stands (positions.py); the plain document is checked against the bundled JSON Schema
(schema.py) and by the checks only code can do (`needs`: known ids, no cycles). Every problem
becomes one `FILE:LINE:COL: message` line (1-based, as gcc, ruff and yamllint print them).

A field or value written in an old spelling is read as its new one, with a warning line at its
position (spellings.py); the warnings are part of what is remembered.

A file that validated once is remembered (cache.py): `diff` on an unchanged state file
imports neither ruamel.yaml nor jsonschema.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ...core.contract import Reconciler, Resource
from ...core.paths import UnsafeOwnFile, check_state_dir
from ...reconcilers import KINDS, key_of, reconciler_class, reconciler_for
from . import cache
from .errors import StateFileError
from .schema import JSON_TYPES, bundled_schema, editor_schema, message_for, schema_fingerprint, sha256, state_validator
from .text import check_size, decode, read_bounded

if TYPE_CHECKING:
    from .positions import Positions
    from .spellings import Found

__all__ = ["LoadedState", "StateFileError", "bundled_schema", "editor_schema", "load", "order_resources",
           "validate_text"]

SUPPORTED_VERSIONS = (1,)


@dataclass(frozen=True)
class LoadedState:
    """A validated state file: its document and its resources, in the order they are reconciled."""

    path: str
    version: int
    host: str | None  # the hostname glob: `host: GLOB`, or `host: {name: GLOB}`
    doc: dict[str, Any]
    resources: tuple[Resource, ...]  # in the order they are reconciled
    machine_id: str | None = None  # `host: {machine_id: ...}`: the /etc/machine-id it is pinned to
    # `FILE:LINE:COL: warning: ...` lines (old spellings, spellings.py), for the command to print once
    warnings: tuple[str, ...] = ()

    @property
    def by_id(self) -> dict[str, Resource]:
        return {r.id: r for r in self.resources}


def build_resources(doc: dict[str, Any],
                    on_kind: Callable[[Reconciler, list[Resource]], None] | None = None) -> list[Resource]:
    """Every declared resource, kind by kind in registry order; `on_kind(reconciler, resources)`
    is called as each kind is built (engine.Prefetch starts observing it there)."""
    resources: list[Resource] = []
    declared = {KINDS[key].prefix: key for key in KINDS
                if key in doc and doc[key] is not None and not KINDS[key].singleton}
    made: dict[str, Reconciler] = {}

    def reconciler(key: str) -> Reconciler:
        # Made when first needed: a kind built later is imported after the kinds before it have
        # started observing (engine.Prefetch forks the GPU observer before the mounts are imported).
        if key not in made:
            made[key] = reconciler_for(key)
        return made[key]

    def canonical(need: str) -> str:
        # `needs: [mount:/tmp/]` names the resource declared `/tmp` (Reconciler.canonical_name).
        prefix, colon, name = need.partition(":")
        key = declared.get(prefix) if colon else None
        return f"{prefix}:{reconciler(key).canonical_name(name)}" if key is not None else need

    for key in KINDS:
        if key in doc and doc[key] is not None:
            rec = reconciler(key)
            built = rec.resources(doc[key])
            built = [r if all(canonical(n) == n for n in r.needs)
                     else replace(r, needs=tuple(canonical(n) for n in r.needs)) for r in built]
            if on_kind is not None:
                on_kind(rec, built)
            resources.extend(built)
    return resources


def order_resources(resources: list[Resource]) -> list[Resource]:
    """Topological order by `needs`; ties broken by kind rank, then declaration order.
    Assumes needs were checked (known, acyclic). Kahn's algorithm with a heap: O(n log n + edges)."""
    import heapq

    index = {r.id: i for i, r in enumerate(resources)}
    ranks = {kind: reconciler_class(key).rank if key else 99
             for kind, key in ((k, key_of(k)) for k in {r.kind for r in resources})}
    rank = {r.id: (ranks[r.kind], index[r.id]) for r in resources}
    by_id = {r.id: r for r in resources}
    waiting = {r.id: {n for n in r.needs if n in index and n != r.id} for r in resources}
    dependents: dict[str, list[str]] = {}
    for rid, deps in waiting.items():
        for dep in deps:
            dependents.setdefault(dep, []).append(rid)
    ready = [rank[rid] + (rid,) for rid, deps in waiting.items() if not deps]
    heapq.heapify(ready)
    ordered: list[Resource] = []
    placed: set[str] = set()
    while len(ordered) < len(resources):
        if not ready:  # a cycle; validation reports it, here keep going in rank order
            rid = min((rid for rid in waiting if rid not in placed), key=rank.__getitem__)
            heapq.heappush(ready, rank[rid] + (rid,))
        rid = heapq.heappop(ready)[-1]
        if rid in placed:
            continue
        placed.add(rid)
        ordered.append(by_id[rid])
        for nxt in dependents.get(rid, ()):
            deps = waiting[nxt]
            deps.discard(rid)
            if not deps and nxt not in placed:
                heapq.heappush(ready, rank[nxt] + (nxt,))
    return ordered


def _check_needs(resources: list[Resource], label: str, pos: Positions, paths: dict[str, tuple]) -> list[str]:
    problems = []
    ids = {r.id: r for r in resources}
    for r in resources:
        for i, need in enumerate(r.needs):
            if need not in ids:
                import difflib

                close = difflib.get_close_matches(need, list(ids), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                line, col = pos.of_value((*paths[r.id], "needs", i))
                problems.append(f"{label}:{line}:{col}: {r.id} needs unknown resource {need!r}{hint}")
            elif need == r.id:
                line, col = pos.of_value((*paths[r.id], "needs", i))
                problems.append(f"{label}:{line}:{col}: {r.id} needs itself")
    # Cycles: an iterative depth-first search over known edges (a chain of 10,000 needs must not
    # exhaust Python's stack), each cycle reported once at the first need that closes it.
    graph = {r.id: [n for n in r.needs if n in ids and n != r.id] for r in resources}
    state: dict[str, int] = {}
    reported: set[frozenset] = set()
    for start in graph:
        if start in state:
            continue
        path, on_path = [start], {start: 0}
        todo = [iter(graph[start])]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                todo.pop()
                state[path.pop()] = 2
                continue
            if state.get(nxt) == 1:
                cycle = path[on_path[nxt]:] + [nxt]
                key = frozenset(cycle)
                if key not in reported:
                    reported.add(key)
                    first = cycle[0]
                    idx = list(ids[first].needs).index(cycle[1])
                    line, col = pos.of_value((*paths[first], "needs", idx))
                    problems.append(f"{label}:{line}:{col}: needs form a cycle: {' -> '.join(cycle)}")
            elif nxt not in state:
                state[nxt] = 1
                on_path[nxt] = len(path)
                path.append(nxt)
                todo.append(iter(graph[nxt]))
    return problems


def validate_text(text: str, label: str) -> dict[str, Any]:
    """Full validation with positions. Returns the plain document (old spellings read as the new
    ones) or raises StateFileError."""
    return validate(text, label)[0]


def validate(text: str, label: str) -> tuple[dict[str, Any], list[Found]]:
    """validate_text, and the warnings found: (line, column, message) each, without the label."""
    from .positions import parse_yaml  # the parser: not needed when the validation cache holds the file
    from .spellings import modernize

    data, pos = parse_yaml(text, label)
    if data is None:
        raise StateFileError([f"{label}:1:1: empty state file: expected a mapping starting with 'version: 1'"])
    if not isinstance(data, dict):
        line, col = pos.of_value(())
        raise StateFileError([f"{label}:{line}:{col}: expected a mapping at the top level, got "
                              f"{JSON_TYPES.get(type(data), 'a scalar')}"])
    if "version" in data and data["version"] not in SUPPORTED_VERSIONS:
        line, col = pos.of_value(("version",))
        known = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise StateFileError([f"{label}:{line}:{col}: unsupported state file version "
                              f"{json.dumps(data['version'])} (this reconcile reads version {known})"])

    found_warnings, renamed_twice = modernize(data, pos)
    warnings = tuple(f"{label}:{line}:{col}: {msg}" for line, col, msg in found_warnings)
    found = [message_for(e, pos) for e in state_validator().iter_errors(data)]
    found += [((line, col), msg) for line, col, msg in renamed_twice]
    if found:
        found.sort()
        seen, problems = set(), []
        for (line, col), msg in found:
            text_line = f"{label}:{line}:{col}: {msg}"
            if text_line not in seen:
                seen.add(text_line)
                problems.append(text_line)
        raise StateFileError(problems, warnings)

    resources = build_resources(data)
    paths = {}
    for key in KINDS:
        section = data.get(key)
        if isinstance(section, dict):
            for r in resources:
                if key_of(r.kind) == key:
                    paths[r.id] = (key,) if r.id == key else (key, r.name)
    problems = _check_needs(resources, label, pos, paths)
    found_by_code = []
    whole = set(paths.values()) | {(key, name) for key in KINDS if not KINDS[key].singleton
                                   and isinstance(data.get(key), dict) for name in data[key]}
    for key in KINDS:  # what only a kind's code can check (a minimum above a maximum)
        if isinstance(data.get(key), dict):
            for where, msg in reconciler_for(key).problems(data[key]):
                # A problem of a resource as a whole (a template unit, a duplicate mount point)
                # stands at its name, the key; any other at the value it is about.
                full = (key, *where)
                at = pos.of_key(full) if full in whole else pos.of_value(full)
                found_by_code.append((at, f"{key}.{msg}"))
    problems.extend(f"{label}:{line}:{col}: {msg}" for (line, col), msg in sorted(found_by_code))
    if problems:
        raise StateFileError(problems, warnings)
    return data, found_warnings


def _unsafe_cache(exc: OSError) -> str:
    return f"{exc} (reconcile keeps its state and validation cache only where no other user can write: " \
           "see RECONCILE_STATE_DIR and RECONCILE_CACHE_DIR in docs/commands.md)"


def load(path: str | os.PathLike, *, text: str | bytes | None = None, use_cache: bool = True,
         on_kind: Callable[[Reconciler, list[Resource]], None] | None = None) -> LoadedState:
    """Read, validate (or trust the cache) and build the ordered resources. `text` (bytes: checked as
    UTF-8 with a position) stands in for the file's content, labelled `path` (a state sent on stdin)."""
    label = str(path)
    if text is None:
        raw = read_bounded(str(path), label, own=True)  # what root applies: root's or the invoking user's
    else:
        raw = text.encode("utf-8", errors="surrogateescape") if isinstance(text, str) else text
        check_size(raw, label)
    text = decode(raw, label)

    digest = sha256(schema_fingerprint().encode() + b"\0" + raw).hexdigest()
    try:
        check_state_dir()  # before any kind is built: the kinds keep their records there
        entry = cache.read(digest) if use_cache else None
    except UnsafeOwnFile as exc:
        raise StateFileError([_unsafe_cache(exc)]) from None
    doc, found = entry if entry is not None else (None, [])
    built = None
    if doc is not None:
        # A cache is a hint, never an authority: an entry that does not build is validated again.
        try:
            built = build_resources(doc, on_kind)
        except Exception:
            doc = None
    if doc is None:
        doc, found = validate(text, label)
        if use_cache:
            try:
                cache.write(digest, doc, found)
            except UnsafeOwnFile as exc:
                raise StateFileError([_unsafe_cache(exc)]) from None
        built = build_resources(doc, on_kind)
    resources = order_resources(built)
    host = doc.get("host")
    pinned = host if isinstance(host, dict) else {"name": host}
    return LoadedState(path=label, version=doc["version"], host=pinned.get("name"), doc=doc,
                       resources=tuple(resources), machine_id=pinned.get("machine_id"),
                       warnings=tuple(f"{label}:{line}:{col}: {msg}" for line, col, msg in found))
