"""YAML with positions, bounded before anything is built.

The text is read as a stream of parser events (ruamel.yaml's libyaml-based CParser when
ruamel.yaml.clib is installed, its pure-Python parser otherwise; both yield the same events),
and this module builds the plain JSON data and a table of positions from them itself. That
lets it refuse, with the position of the offending node, what a state file has no use for
before any of it is built: more than LIMITS allow (bytes, nesting depth, nodes counted after
alias expansion, aliases to collections — the rule of SnakeYAML's maxAliasesForCollections),
tags, several documents, keys that are neither strings nor integers, duplicate keys (an integer key
is its decimal text, so `1:` beside `'1':` is a duplicate). What it accepts is
documented in docs/state-file.md ("What YAML a state file may use").

Plain scalars are resolved by the YAML 1.2 core schema as ruamel.yaml's own resolver has it
(ruamel/yaml/resolver.py, the (1, 2) implicit resolvers; constructor.py construct_yaml_int and
construct_yaml_float), except that timestamps stay strings (the core schema has none) and
numbers that cannot be represented faithfully (more than 19 digits, out of the 64-bit range,
infinite, not a number) are refused. tests/test_fuzz_statefile.py holds the result equal to
ruamel's safe loader wherever these documented rules do not differ.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import Position, StateFileError

# The bounded reading of the text lives in text.py, which the validation cache's path imports
# without this module; its names are kept here for the callers that parse.
from .text import BREAK, LIMITS, Limits, byte_line_col, check_size, decode, line_col, read_bounded  # noqa: F401

_BREAK = re.compile(BREAK)


@dataclass
class Positions:
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


# --- text-level checks (the bounded reading itself: text.py) -------------------------------

# YAML's printable set (YAML 1.2 §5.1 c-printable; ruamel's reader.py NON_PRINTABLE) less U+0085
# (NEL), U+2028 and U+2029 (LINE and PARAGRAPH SEPARATOR): YAML 1.1 counts them line breaks and
# YAML 1.2 does not, so libyaml and ruamel's own parser put the lines after them at different
# numbers (the fuzzer's seed 13, input 1649: U+2028 before a newline), and so do editors. NEL is a
# C1 control character besides. A state file refuses them with the control characters, where
# they stand; in a double-quoted string they can still be written as escapes.
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# --- scalars: YAML 1.2 core schema as ruamel resolves it ----------------------------------

_NULLS = frozenset(("", "~", "null", "Null", "NULL"))
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?[0-9_]+|[-+]?0x[0-9a-fA-F_]+")
_FLOAT = re.compile(r"""[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                        |[-+]?\.[0-9_]+(?:[eE][-+][0-9]+)?""", re.X)
_NONFINITE = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
_INT_BOUND = 2**63


class _Problem(Exception):
    def __init__(self, message: str):
        self.message = message


def resolve_plain(value: str, limits: Limits = LIMITS, what: str = "a state file") -> Any:
    """A plain (unquoted, untagged) scalar -> None, bool, int, float or str. _Problem for numbers
    that cannot be represented faithfully."""
    if value in _NULLS:
        return None
    first = value[0]
    if first in "tTfF" and value in _BOOLS:
        return _BOOLS[value]
    if first not in "-+0123456789.":
        return value
    if _INT.fullmatch(value):
        digits = value.replace("_", "")
        sign = -1 if digits[:1] == "-" else 1
        digits = digits.lstrip("+-")
        if not digits:
            return value  # only underscores (ruamel fails on it): a string
        base = {"0b": 2, "0x": 16, "0o": 8}.get(digits[:2], 10)
        body = digits[2:] if base != 10 else digits
        if len(body.lstrip("0")) > limits.max_int_digits:
            raise _Problem(f"integer {_short(value)} has more than {limits.max_int_digits} digits")
        n = sign * int(body, base) if body else 0
        if not -_INT_BOUND <= n < _INT_BOUND:
            raise _Problem(f"integer {_short(value)} is out of range (a 64-bit integer)")
        return n
    if _FLOAT.fullmatch(value):
        f = float(value.replace("_", ""))
        if not math.isfinite(f):
            raise _Problem(f"number {_short(value)} is too large")
        return f
    if _NONFINITE.fullmatch(value):
        raise _Problem(f"{value} (infinity or not-a-number) is not allowed in {what}")
    return value


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _tag_text(tag: Any) -> str:
    tag = str(tag)
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


# --- the builder --------------------------------------------------------------------------

# A node of the document: (kind, payload, line, col, size, height) with kind "s" (scalar: the
# value), "m" (mapping: [(key, key_position, node)]) or "q" (sequence: [node]). size counts
# the nodes its expansion makes; aliases share the node they name.
_S, _M, _Q = "s", "m", "q"


class _Builder:
    def __init__(self, label: str, limits: Limits, what: str = "a state file"):
        self.label = label
        self.what = what  # "a state file", "an inventory": what the messages call the document
        self.limits = limits
        self.problems: list[tuple[int, int, str]] = []
        self.anchors: dict[str, tuple] = {}
        self.open_anchors: set[str] = set()
        self.nodes = 0           # nodes after expansion, so far
        self.collection_aliases = 0
        self.documents = 0

    def fatal(self, mark: Any, message: str) -> StateFileError:
        line, col = mark.line + 1, mark.column + 1
        found = sorted(self.problems + [(line, col, message)])
        return StateFileError([f"{self.label}:{ln}:{c}: {m}" for ln, c, m in found])

    def problem(self, mark: Any, message: str) -> None:
        self.problems.append((mark.line + 1, mark.column + 1, message))

    def count(self, mark: Any, n: int, what: str = "") -> None:
        self.nodes += n
        if self.nodes > self.limits.max_nodes:
            raise self.fatal(mark, f"too many nodes: more than {self.limits.max_nodes}{what} "
                                   f"(the limit of {self.what}); stopped reading here")

    def build(self, events: Iterable[Any]) -> tuple | None:
        """The document's root node (None when the stream is empty); raises StateFileError."""
        stack: list[list] = []   # open collections: [kind, items, line, col, anchor, pending_key, depth]
        root: tuple | None = None
        depth = 0
        for ev in events:
            name = type(ev).__name__
            if name == "ScalarEvent" or name == "AliasEvent":
                node = self._scalar(ev) if name == "ScalarEvent" else self._alias(ev, depth)
            elif name == "MappingStartEvent" or name == "SequenceStartEvent":
                depth += 1
                if depth > self.limits.max_depth:
                    raise self.fatal(ev.start_mark, f"nested too deep: more than {self.limits.max_depth} levels "
                                                    f"(the limit of {self.what})")
                self.count(ev.start_mark, 1)
                self._no_tag(ev)
                if ev.anchor is not None:
                    self.open_anchors.add(ev.anchor)
                kind = _M if name == "MappingStartEvent" else _Q
                stack.append([kind, [], ev.start_mark, ev.anchor, None, []])
                continue
            elif name == "MappingEndEvent" or name == "SequenceEndEvent":
                depth -= 1
                kind, items, mark, anchor, _, merges = stack.pop()
                node = self._close(kind, items, mark, merges)
                if anchor is not None:
                    self.open_anchors.discard(anchor)
                    self.anchors[anchor] = node
            elif name == "DocumentStartEvent":
                self.documents += 1
                if self.documents > 1:
                    raise self.fatal(ev.start_mark, f"a second YAML document starts here: {self.what} is one "
                                                    "document (remove the '---' line or split the file)")
                version = getattr(ev, "version", None)
                if version is not None and tuple(version) != (1, 2):
                    raise self.fatal(ev.start_mark, f"%YAML {'.'.join(map(str, version))}: {self.what} is "
                                                    "read as YAML 1.2; remove the directive")
                continue
            else:  # stream start/end, document end
                continue
            if not stack:
                root = node
                continue
            self._add(stack[-1], node)
        return root

    def _no_tag(self, ev: Any) -> None:
        if ev.tag is not None:
            self.problem(ev.start_mark, f"tag {_tag_text(ev.tag)!r} is not allowed in {self.what} "
                                        "(write the value plainly; quote it to make it a string)")

    def _scalar(self, ev: Any) -> tuple:
        self.count(ev.start_mark, 1)
        mark = ev.start_mark
        value: Any = ev.value
        if ev.tag is not None:
            self._no_tag(ev)
            value = None
        elif ev.implicit[0] and not ev.style:
            try:
                value = resolve_plain(value, self.limits, self.what)
            except _Problem as exc:
                self.problem(mark, exc.message)
                value = None
        node = (_S, value, mark.line + 1, mark.column + 1, 1, 0, ev.implicit[0] and not ev.style
                and ev.tag is None and ev.value == "<<")
        if ev.anchor is not None:
            self.anchors[ev.anchor] = node
        return node

    def _alias(self, ev: Any, depth: int) -> tuple:
        mark = ev.start_mark
        target = self.anchors.get(ev.anchor)
        if target is None:
            if ev.anchor in self.open_anchors:
                raise self.fatal(mark, f"alias *{ev.anchor} refers to a node that contains it (a recursive alias)")
            raise self.fatal(mark, f"alias *{ev.anchor} names no anchor defined before it")
        if target[0] != _S:
            self.collection_aliases += 1
            if self.collection_aliases > self.limits.max_collection_aliases:
                raise self.fatal(mark, f"too many aliases to collections: more than "
                                       f"{self.limits.max_collection_aliases} (the limit of {self.what})")
            if depth + target[5] > self.limits.max_depth:
                raise self.fatal(mark, f"alias *{ev.anchor} nests too deep: more than {self.limits.max_depth} "
                                       f"levels once expanded (the limit of {self.what})")
        self.count(mark, target[4], " once aliases are expanded")
        return (*target[:2], mark.line + 1, mark.column + 1, *target[4:6], False, target)

    def _add(self, parent: list, node: tuple) -> None:
        if parent[0] == _Q:
            parent[1].append(node)
            return
        if parent[4] is None:  # a key
            parent[4] = node
            return
        key, parent[4] = parent[4], None
        if key[0] == _S and len(key) > 6 and key[6]:  # `<<`: a merge key
            self._merge(parent, key, node)
            return
        if key[0] != _S:
            self.problem(_Mark(key), "a mapping key must be a string, not a "
                                     f"{'mapping' if key[0] == _M else 'list'}")
            return
        name = key[1]
        if isinstance(name, int) and not isinstance(name, bool):
            # An integer key is a name written without quotes: `per_gpu: {3: ...}` names GPU 3. It
            # becomes its decimal text, so `3:` and `'3':` side by side are a duplicate key.
            name = str(name)
        if not isinstance(name, str):
            shown = "null" if name is None else str(name).lower() if isinstance(name, bool) else name
            self.problem(_Mark(key), f"key {shown} is not a string: quote it ('{shown}') to use it as a name")
            return
        if len(name) > self.limits.max_key_chars:
            self.problem(_Mark(key), f"key of {len(name)} characters: more than {self.limits.max_key_chars}")
            return
        parent[1].append((name, (key[2], key[3]), node))

    def _merge(self, parent: list, key: tuple, node: tuple) -> None:
        sources = [node] if node[0] != _Q else list(node[1])
        for src in sources:
            if src[0] != _M:
                self.problem(_Mark(src), "a merge key '<<' takes a mapping, an alias of one, or a list of them")
                return
        parent[5].append(sources)

    def _close(self, kind: str, items: list, mark: Any, merges: list) -> tuple:
        line, col = mark.line + 1, mark.column + 1
        if kind == _Q:
            return (_Q, items, line, col, 1 + sum(n[4] for n in items), 1 + max((n[5] for n in items), default=0))
        seen: dict[str, tuple[int, int]] = {}
        out = []
        for key, kpos, value in items:
            if key in seen:
                self.problems.append((*kpos, f"duplicate key {key!r} (first defined at line {seen[key][0]})"))
                continue
            seen[key] = kpos
            out.append((key, kpos, value))
        # YAML's merge key (https://yaml.org/type/merge.html): keys of the mapping itself win, then the
        # merged mappings in the order given.
        for sources in merges:
            for src in sources:
                for key, kpos, value in src[1]:
                    if key not in seen:
                        seen[key] = kpos
                        out.append((key, kpos, value))
        size = 1 + sum(v[4] for _, _, v in out)
        return (_M, out, line, col, size, 1 + max((v[5] for _, _, v in out), default=0))


class _Mark:
    """A mark for a node already built."""

    def __init__(self, node: tuple):
        self.line, self.column = node[2] - 1, node[3] - 1


def _plain(node: tuple, path: tuple, pos: Positions) -> Any:
    """Nodes -> plain JSON data, recording positions on the way (an alias keeps its own position)."""
    pos.values[path] = (node[2], node[3])
    kind = node[0]
    if kind == _S:
        return node[1]
    if kind == _Q:
        return [_plain(item, (*path, i), pos) for i, item in enumerate(node[1])]
    out = {}
    for key, kpos, value in node[1]:
        child = (*path, key)
        pos.keys[child] = kpos
        out[key] = _plain(value, child, pos)
    return out


def _have_cparser() -> bool:
    """ruamel.yaml.clib (libyaml's parser) installed? Imported only when a file is validated."""
    try:
        import _ruamel_yaml  # noqa: F401
    except ImportError:
        return False
    return True


def _events(text: str, pure: bool):
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=pure).parse(text)


def _parse_error(exc: Exception, label: str) -> StateFileError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0] or "invalid YAML"
    return StateFileError([f"{label}:{line}:{col}: {problem}"])


def parse_yaml(text: str, label: str, limits: Limits = LIMITS,
               what: str = "a state file") -> tuple[Any, Positions]:
    """The document as plain data and its positions; StateFileError with positions otherwise."""
    from ruamel.yaml.error import YAMLError

    if len(text) > limits.max_bytes:  # text handed in directly; files are checked as bytes
        line, col = line_col(text, limits.max_bytes)
        raise StateFileError([f"{label}:{line}:{col}: file too large: more than {limits.max_bytes} characters"])
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line, col = line_col(text, bad.start())
        code = ord(bad.group())
        if code in (0x2028, 0x2029):
            raise StateFileError([f"{label}:{line}:{col}: line separator U+{code:04X} is not allowed in {what}: YAML "
                                  "parsers and editors disagree on where the next line starts (write it as an "
                                  f"escape, \\u{code:04x}, in a double-quoted string)"])
        raise StateFileError([f"{label}:{line}:{col}: control character U+{code:04X} is not allowed "
                              f"in {what} (write it as an escape such as \\x00 in a double-quoted string)"])
    builder = _Builder(label, limits, what)
    try:
        root = builder.build(_events(text, pure=not _have_cparser()))
    except YAMLError:
        # libyaml (the C parser) is a YAML 1.1 scanner: it refuses some YAML 1.2 that ruamel's
        # own parser reads (`[unit:a.service]`: a ':' in a flow scalar), and its messages are not
        # the documented ones. ruamel's parser is the authority: parse again with it.
        builder = _Builder(label, limits, what)
        try:
            root = builder.build(_events(text, pure=True))
        except YAMLError as exc:
            raise _parse_error(exc, label) from None
    if builder.problems:
        builder.problems.sort()
        raise StateFileError([f"{label}:{ln}:{c}: {m}" for ln, c, m in builder.problems])
    pos = Positions()
    if root is None:
        return None, pos
    return _plain(root, (), pos), pos
