"""systemd 252's unit names and unit-file syntax, as its install logic reads them to work out a
unit's UnitFileState: a port of the few rules the in-process reader needs, each from the function
cited beside it (systemd v252.38: `src/basic/unit-name.c`, `src/basic/unit-file.c`,
`src/basic/fileio.c`, `src/basic/utf8.c`, `src/basic/string-util.c`, `src/basic/path-util.c`,
`src/shared/conf-parser.c`, `src/shared/install.c`).

The reader only ever *settles* a unit with these rules; wherever systemd would fail (a unit it
reports `bad`) or where the port does not follow systemd all the way (quotes, escapes,
specifiers), `parse_install` answers None and the unit is handed to `systemctl show`. The
differential suite (tests/test_units_differential.py) holds every rule against the live systemd."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# unit-name.c:VALID_CHARS_WITH_AT (ASCII only), unit.h: the unit types.
UNIT_TYPES = frozenset({"service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path",
                        "slice", "scope"})
_VALID_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:-_.\\@")
UNIT_NAME_MAX = 256  # unit-name.h: a name is shorter than this (at most 255 bytes)
# unit-file.c:unit_type_may_alias / unit_type_may_template
MAY_ALIAS = frozenset({"service", "socket", "target", "device", "timer", "path"})
MAY_TEMPLATE = frozenset({"service", "socket", "target", "timer", "path"})

WHITESPACE = b" \t\n\r"  # string-util.h:WHITESPACE, what strstrip() removes: nothing else
COMMENTS = b"#;"
BOM = b"\xef\xbb\xbf"  # utf8.h:UTF8_BYTE_ORDER_MARK
LONG_LINE_MAX = 1024 * 1024  # def.h: read_line() fails with ENOBUFS on a line this long
# install.c:unit_file_load: the sections config_parse() is given; "-X" ones are known and skipped.
_SECTIONS = frozenset({b"Install", b"-Unit", b"-Automount", b"-Device", b"-Mount", b"-Path", b"-Scope",
                       b"-Service", b"-Slice", b"-Socket", b"-Swap", b"-Target", b"-Timer"})
# path-util.c:hidden_or_backup_file
_BACKUP_SUFFIXES = frozenset({"rpmnew", "rpmsave", "rpmorig", "dpkg-old", "dpkg-new", "dpkg-tmp", "dpkg-dist",
                              "dpkg-bak", "dpkg-backup", "dpkg-remove", "ucf-new", "ucf-old", "ucf-dist", "swp",
                              "bak", "old", "new"})


def name_kind(name: str) -> str | None:
    """unit-name.c:unit_name_is_valid: "plain", "instance", "template", or None for a name systemd
    refuses. The type is what follows the last dot; the first @ must not start the name."""
    if not name or len(name.encode("utf-8", "surrogateescape")) >= UNIT_NAME_MAX:
        return None
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem or suffix not in UNIT_TYPES:
        return None
    if not _VALID_CHARS.issuperset(stem):
        return None
    at = stem.find("@")
    if at == 0:
        return None
    if at < 0:
        return "plain"
    return "template" if at == len(stem) - 1 else "instance"


def unit_type(name: str) -> str:
    return name.rpartition(".")[2]


def systemd_refuses(name: str) -> str | None:
    """Why systemd refuses to look a unit of this name up at all, or None: not a valid name
    (unit_name_is_valid), or a template/instance of a type that cannot be templated
    (install.c:unit_file_load, unit-file.c:unit_type_may_template). `systemctl show` of such a
    name fails ("Unknown object") and ends a batched `show` there."""
    kind = name_kind(name)
    if kind is None:
        return f"{name} is not a valid unit name for systemd"
    if kind != "plain" and unit_type(name) not in MAY_TEMPLATE:
        return f"{name}: systemd cannot template .{unit_type(name)} units (Invalid argument)"
    return None


def hidden_or_backup(name: str) -> bool:
    """path-util.c:hidden_or_backup_file: what FOREACH_DIRENT skips in every directory scan."""
    if name.startswith(".") or name in ("lost+found", "aquota.user", "aquota.group") or name.endswith("~"):
        return True
    _, dot, suffix = name.rpartition(".")
    return bool(dot) and suffix in _BACKUP_SUFFIXES


# fileio.c:read_line_full with categorize_eol: a line ends at \n, \r or NUL, and one line end is
# the longest run of these in which no kind repeats and nothing follows a NUL.
_EOL = re.compile(b"\n\r\0|\r\n\0|\n\r|\r\n|\n\0|\r\0|\n|\r|\0")


def read_lines(data: bytes) -> list[bytes] | None:
    r"""The lines of a file as systemd's read_line() cuts them: at \n, \r, NUL, \r\n, \n\r,
    \n\0, \r\n\0, ... (\n\n is two). Nothing else ends a line (not \v, \f, \x1c-\x1e,
    U+0085, U+2028, U+2029, where str.splitlines() does). None: a line of LONG_LINE_MAX bytes or
    more (ENOBUFS)."""
    lines = data.split(b"\n") if b"\r" not in data and b"\0" not in data else _EOL.split(data)
    if lines and not lines[-1]:
        lines.pop()  # the end of the last line, or an empty file
    if len(data) >= LONG_LINE_MAX and any(len(line) >= LONG_LINE_MAX for line in lines):
        return None
    return lines


def utf8_is_valid(line: bytes) -> bool:
    """utf8.c:utf8_is_valid_n / unichar_is_valid: well-formed UTF-8 (no overlong forms, no
    surrogates, nothing past U+10FFFF, as Python's codec) and no noncharacters (U+FDD0-U+FDEF,
    U+xxFFFE, U+xxFFFF), which Python's codec accepts."""
    if line.isascii():
        return True
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not any(0xFDD0 <= ord(c) <= 0xFDEF or ord(c) & 0xFFFE == 0xFFFE for c in text if ord(c) >= 0xFDD0)


def string_is_safe(s: bytes) -> bool:
    """string-util.c:string_is_safe: no control byte 0x01-0x1f, no quote, backslash or DEL (bytes
    from 0x80 are allowed: `char` is signed)."""
    return not any(b < 0x20 or b in b"\"'\\\x7f" for b in s)


@dataclass
class Install:
    """The [Install] lists install.c fills from a unit file and its drop-ins (unit_file_load's
    table), kept as their lengths' worth: only whether each is empty decides the state. Aliases
    are kept by name: a link with an Alias= name makes the unit enabled (is_symlink_with_known_name)."""

    aliases: list[str] = field(default_factory=list)
    wanted_by: int = 0
    required_by: int = 0
    also: int = 0

    @property
    def has_rules(self) -> bool:
        """install.c:install_info_has_rules"""
        return bool(self.aliases or self.wanted_by or self.required_by)


class Unsure(Exception):
    """systemd would fail on this file (the unit is `bad`), or this port does not follow it all
    the way: let systemd answer."""


def _words(value: bytes) -> list[bytes]:
    """Words as extract_first_word() cuts them, for values without quotes or backslashes (the
    caller checks): separated by WHITESPACE only."""
    out, word = [], bytearray()
    for b in value:
        if b in WHITESPACE:
            if word:
                out.append(bytes(word))
                word = bytearray()
        else:
            word.append(b)
    if word:
        out.append(bytes(word))
    return out


def _assign(info: Install, utype: str, key: bytes, value: bytes) -> None:
    """One assignment in [Install] (install.c:unit_file_load's table). Unknown keys (UpheldBy=
    among them: systemd 252 does not know it) are ignored, as next_assignment() does."""
    if key not in (b"Alias", b"WantedBy", b"RequiredBy", b"Also", b"DefaultInstance"):
        return
    if key == b"DefaultInstance":
        return  # config_parse_default_instance: ignored for the plain and instance names asked about
    if key == b"Alias" and utype not in MAY_ALIAS:
        return  # install.c:config_parse_alias: "Alias= is not allowed for ... units, ignoring."
    if any(c in value for c in b"\"'\\"):
        raise Unsure("quotes or escapes")  # extract_first_word's unquoting is not ported
    if key == b"Also":
        # install.c:config_parse_also: no reset on an empty value; every word through
        # install_name_printf() (specifiers) and install_info_add(), which fails for an invalid name.
        for word in _words(value):
            if b"%" in word:
                raise Unsure("specifier in Also=")
            if name_kind(word.decode("utf-8", "surrogateescape")) is None:
                raise Unsure("invalid unit name in Also= (systemd: Invalid argument)")
            info.also += 1
        return
    # conf-parser.c:config_parse_strv: an empty value resets the list; words are not validated
    # and specifiers are not expanded when the state is worked out.
    words = _words(value)
    if key == b"Alias":
        info.aliases = info.aliases + [w.decode("utf-8", "surrogateescape") for w in words] if words else []
    elif key == b"WantedBy":
        info.wanted_by = info.wanted_by + len(words) if words else 0
    else:
        info.required_by = info.required_by + len(words) if words else 0


def _parse_line(line: bytes, info: Install, utype: str, section: list[bytes | None]) -> None:
    """conf-parser.c:parse_line on one logical line; `section` is the current section (a
    one-item list, None outside any or in an ignored one)."""
    line = line.strip(WHITESPACE)
    if not line:
        return
    if not utf8_is_valid(line):
        raise Unsure("invalid UTF-8 (systemd: Invalid argument)")
    if line[:1] == b"[":
        if line[-1:] != b"]":
            raise Unsure("invalid section header (systemd: Bad message)")
        name = line[1:-1]
        if not string_is_safe(name):
            raise Unsure("bad characters in section header (systemd: Bad message)")
        # Only the names in the list, literally, are sections; the others (X-..., Unit, ...) are
        # ignored with the assignments under them.
        section[0] = name if name in _SECTIONS else None
        return
    if section[0] != b"Install":
        return  # outside any section, in an ignored one, or in one whose keys install.c skips
    key, eq, value = line.partition(b"=")
    if not eq or not key:
        return  # "Missing '='" / "Missing key name before '='": a warning, ignored
    _assign(info, utype, key.strip(WHITESPACE), value.strip(WHITESPACE))


def parse_install(data: bytes, utype: str, info: Install | None = None) -> Install:
    """conf-parser.c:config_parse as install.c:unit_file_load calls it, on the bytes of a unit
    file or drop-in; adds to `info` (drop-ins add to what the unit file set). Raises Unsure."""
    info = info if info is not None else Install()
    lines = read_lines(data)
    if lines is None:
        raise Unsure("line too long (systemd: No buffer space available)")
    section: list[bytes | None] = [None]
    continuation: bytes | None = None
    bom_seen = False
    for buf in lines:
        # Comments are dropped first, on the raw line: before the BOM and the continuation.
        stripped = buf.lstrip(WHITESPACE)
        if stripped[:1] and stripped[:1] in COMMENTS:
            continue
        line = buf
        if not bom_seen and buf.startswith(BOM):
            line, bom_seen = buf[len(BOM):], True  # once per file, on the first line that has it
        if continuation is not None:
            if len(continuation) + len(line) > LONG_LINE_MAX:
                raise Unsure("continuation line too long")
            current = continuation + line
        else:
            current = line
        if _ends_escaped(current):
            continuation = current[:-1] + b" "  # the backslash becomes a space; the line goes on
            continue
        _parse_line(current, info, utype, section)
        continuation = None
    if continuation is not None:
        _parse_line(continuation, info, utype, section)
    return info


def _ends_escaped(line: bytes) -> bool:
    """Whether the line ends in a backslash that is not itself escaped (config_parse's loop over
    the line: each backslash escapes the next byte), i.e. in an odd run of backslashes."""
    return line.endswith(b"\\") and (len(line) - len(line.rstrip(b"\\"))) % 2 == 1


def parse_all(texts: Iterable[bytes], utype: str) -> Install:
    """A unit file and then its drop-ins, in order, into one Install."""
    info = Install()
    for data in texts:
        parse_install(data, utype, info)
    return info
