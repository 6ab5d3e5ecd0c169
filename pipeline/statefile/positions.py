"""YAML with positions: ruamel's round-trip loader is used only to learn where each key and
value stands; the document becomes plain JSON data plus a table of positions, so jsonschema
and the reconcilers never see ruamel types."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import Position, StateFileError


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


def plain(node: Any, path: tuple, pos: Positions) -> Any:
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
            out[str(key)] = plain(node[key], child, pos)
        return out
    if isinstance(node, CommentedSeq):
        out_list = []
        for i, item in enumerate(node):
            line, col = node.lc.item(i)
            pos.values[(*path, i)] = (line + 1, col + 1)
            out_list.append(plain(item, (*path, i), pos))
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


def parse_yaml(text: str, label: str) -> tuple[Any, Positions]:
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
    pos = Positions()
    return plain(doc, (), pos), pos
