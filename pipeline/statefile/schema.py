"""The state file's JSON Schema: state.schema.json with each registered kind's fragment bundled
in, the format checks done in code (sizes, durations, unit names), and readable messages for
jsonschema's errors."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any

from ...core.values import dotted, is_unit_name, parse_duration, parse_size, parse_size_or_percent
from ...reconcilers import KINDS
from .errors import Position

if TYPE_CHECKING:
    from .positions import Positions

try:  # the builtin SHA-256: `import hashlib` loads OpenSSL, ~10 ms of every start-up
    from _sha256 import sha256
except ImportError:  # Python >= 3.12 renamed it
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256


# Paths as strings: pathlib (with urllib.parse and ipaddress) is ~10 ms of every start-up.
SCHEMA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))), "schema")

_BUNDLE: dict[str, Any] = {}


def read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


OLD_SPELLINGS = "x-old-spellings"  # a fragment's table of deprecated spellings (spellings.py)


def fragment(key: str) -> dict[str, Any]:
    """Kind KEY's schema fragment as written, its table of old spellings included."""
    return read_json(os.path.join(SCHEMA_DIR, "kinds", f"{key}.schema.json"))


def old_spellings() -> dict[str, list[dict[str, str]]]:
    """Each kind's deprecated spellings, from its fragment: [{key, now}] for a renamed field,
    [{key, value, now}] for a renamed value. The fragments are the one table: the loader reads
    them, the editor schema marks them, and the validation cache's fingerprint covers them."""
    if "old" not in _BUNDLE:
        _BUNDLE["old"] = {key: fragment(key).get(OLD_SPELLINGS, []) for key in KINDS}
    return _BUNDLE["old"]


def bundled_schema() -> dict[str, Any]:
    """state.schema.json with each registered kind's fragment under $defs and properties, and
    the ids `needs` may name derived from the registry (a new kind needs no edit here). The
    current spellings only: what a state file is validated against once its old spellings are
    read as the new ones (spellings.py); editor_schema() is what editors get."""
    if "bundle" not in _BUNDLE:
        schema = read_json(os.path.join(SCHEMA_DIR, "state.schema.json"))
        for key in KINDS:
            fragment = read_json(os.path.join(SCHEMA_DIR, "kinds", f"{key}.schema.json"))
            fragment.pop("$schema", None)
            fragment.pop(OLD_SPELLINGS, None)
            schema["$defs"][key] = fragment
            schema["properties"][key] = {"$ref": f"#/$defs/{key}"}
        forms = [id_form(key) for key in KINDS]
        alternatives = "|".join(re.escape(KINDS[key].prefix) + ("" if KINDS[key].singleton else ":.+")
                                for key in KINDS)
        need = schema["$defs"]["needs"]
        need["description"] = ("Resources that must have ended ok before this one is acted on: "
                               + ", ".join(forms) + ".")
        need["items"]["pattern"] = f"^({alternatives})$"
        need["items"]["errorMessage"] = "invalid need {v!r}: expected " + ", ".join(forms[:-1]) + \
            (" or " if len(forms) > 1 else "") + forms[-1]
        _BUNDLE["bundle"] = schema
    return _BUNDLE["bundle"]


def editor_schema() -> dict[str, Any]:
    """What `reconcile schema` prints (and schema/reconcile-state.schema.json ships): the bundle,
    with each old spelling accepted and marked `deprecated` (JSON Schema 2020-12's annotation;
    VS Code's `deprecationMessage` names the new spelling), so an editor flags it without calling
    a file that still works invalid. Both spellings of one field are refused, as the loader does."""
    import copy

    schema = copy.deepcopy(bundled_schema())
    for key, entries in old_spellings().items():
        fields = schema["$defs"][key]
        if not KINDS[key].singleton:
            fields = fields["additionalProperties"]
        props = fields["properties"]
        for entry in entries:
            if "value" in entry:
                field = props[entry["key"]]
                current = {"enum": field.pop("enum")} if "enum" in field else {}
                alternatives = field.setdefault("anyOf", [current])
                alternatives.append({"const": entry["value"], "deprecated": True,
                                     "deprecationMessage": f"{entry['value']!r} is deprecated: write {entry['now']!r}"})
            else:
                message = f"{entry['key']!r} is deprecated: write {entry['now']!r}"
                props[entry["key"]] = {**props[entry["now"]], "deprecated": True, "deprecationMessage": message,
                                       "description": f"Deprecated spelling of {entry['now']!r}. "
                                                      + props[entry["now"]].get("description", "")}
                fields.setdefault("allOf", []).append({
                    "not": {"required": [entry["key"], entry["now"]]},
                    "errorMessage": f"{entry['key']!r} is the old spelling of {entry['now']!r}: give one of them"})
    return schema


def id_form(key: str) -> str:
    """How a resource of kind KEY is named in `needs`: `unit:NAME`, or the singleton's `gpus`."""
    kind = KINDS[key]
    return kind.prefix if kind.singleton else f"{kind.prefix}:{kind.name_word}"


def schema_fingerprint() -> str:
    """What a cached verdict depends on: the files bundled_schema() reads (not the report or
    inventory schemas, nor the generated bundle), the registered kinds and reconcile's version
    (the checks done in code, such as `needs`, change with it)."""
    from ... import __version__

    h = sha256(__version__.encode())
    for path in [os.path.join(SCHEMA_DIR, "state.schema.json"),
                 *(os.path.join(SCHEMA_DIR, "kinds", f"{k}.schema.json") for k in KINDS)]:
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as fh:
            h.update(fh.read())
    h.update(repr(sorted(KINDS.items())).encode())
    return h.hexdigest()


def format_checker():
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
    # PATH_MAX is 4096 bytes with the NUL: no system call takes a longer path (or a NUL byte).
    checker.checks("abs-path")(lambda v: not isinstance(v, str) or (
        v.startswith("/") and "\0" not in v and len(v.encode("utf-8", "surrogateescape")) < 4096))
    return checker


def state_validator():
    """The validator of the bundled schema, made once. JSON Schema's `integer` admits 8.0; a state
    file's integers are integers (a float where a count is meant would pass and fail later)."""
    if "validator" not in _BUNDLE:
        import jsonschema

        base = jsonschema.Draft202012Validator
        types = base.TYPE_CHECKER.redefine(
            "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool))
        cls = jsonschema.validators.extend(base, type_checker=types)
        _BUNDLE["validator"] = cls(bundled_schema(), format_checker=format_checker())
    return _BUNDLE["validator"]


FORMAT_HINTS = {
    "size": "invalid size {v!r}: use a number with a unit such as 512MiB, 4TiB or 75.8GB",
    "size-or-percent": "invalid size {v!r}: use e.g. 4TiB, 75.8GB or a percentage such as '15%'",
    "duration": "invalid duration {v!r}: use e.g. 500ms, 10s, 5m or 1h30m",
    "unit-name": "invalid systemd unit name {v!r}: expected NAME.service, NAME.timer, NAME@INSTANCE.service, ...",
    "abs-path": "{v!r} is not an absolute path (it must start with /, be shorter than 4096 bytes, hold no NUL)",
}


JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
               dict: "mapping", type(None): "null"}


def message_for(error: Any, doc_pos: Positions) -> tuple[Position, str]:
    """One jsonschema error -> (position, readable message)."""
    path = tuple(error.absolute_path)
    where = dotted(path)
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
        return doc_pos.of_key((*path, error.instance)), FORMAT_HINTS[error.validator_value].format(
            v=error.instance)
    if v == "format":
        return doc_pos.of_value(path), prefix + FORMAT_HINTS[error.validator_value].format(v=error.instance)
    if v == "required":
        m = re.match(r"'([^']*)'", error.message)
        missing = m.group(1) if m else error.message
        return doc_pos.of_value(path), f"{prefix}missing required key {missing!r}"
    if v == "type":
        names = {"object": "mapping", "array": "list"}  # YAML's words
        want = error.validator_value
        want = " or ".join(names.get(w, w) for w in want) if isinstance(want, list) else names.get(want, want)
        have = JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
        return doc_pos.of_value(path), f"{prefix}expected {want}, got {have} {json.dumps(error.instance)}"
    if v == "enum":
        choices = ", ".join(json.dumps(c) for c in error.validator_value)
        return doc_pos.of_value(path), f"{prefix}expected one of {choices}; got {json.dumps(error.instance)}"
    if v in ("oneOf", "anyOf") and error.context and not error.schema.get("errorMessage"):
        import jsonschema.exceptions

        return message_for(jsonschema.exceptions.best_match(error.context), doc_pos)
    if v == "pattern" and "propertyNames" in error.relative_schema_path:
        return doc_pos.of_key((*path, error.instance)), f"{prefix}invalid name {error.instance!r}"
    message = error.schema.get("errorMessage")
    if message:
        return doc_pos.of_value(path), prefix + message.format(v=error.instance)
    return doc_pos.of_value(path), prefix + error.message
