"""A state file's bytes: read with a bound, decoded as UTF-8, and positions of characters
counted as YAML parsers count them. What `load` needs before it knows whether the validation
cache holds the file: positions.py (the parser) is imported only when the text is parsed."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from .errors import Position, StateFileError


@dataclass(frozen=True)
class Limits:
    """What one state file (or inventory) may hold; each violation is one line with a position."""

    max_bytes: int = 4 * 2**20           # 10,000 units are about 0.6 MiB
    max_depth: int = 64                  # a state file nests 5 deep
    max_nodes: int = 500_000             # scalars and collections, counted after alias expansion
    max_collection_aliases: int = 50     # SnakeYAML's maxAliasesForCollections default
    # YAML 1.2 limits implicit keys to 1,024 characters; a mount point may be up to PATH_MAX
    # (4,096 bytes with its NUL), and is a key here: that is the limit.
    max_key_chars: int = 4095
    max_int_digits: int = 19             # 2**63 has 19 digits; Python's int() refuses > 4300


LIMITS = Limits()


# What YAML parsers count as a line break; compiled when a position is needed (an error, the
# parser's positions.py), not at every start-up: its Unicode class takes ~0.3 ms.
BREAK = "\r\n|[\r\n\x85\u2028\u2029]"


def line_col(text: str, index: int) -> Position:
    """1-based line and column of character `index`, counting line breaks as YAML parsers do."""
    line, start = 1, 0
    for m in re.compile(BREAK).finditer(text, 0, index):
        line, start = line + 1, m.end()
    return line, index - start + 1


def byte_line_col(raw: bytes, index: int) -> Position:
    """line_col for a byte offset of (possibly not quite UTF-8) bytes."""
    prefix = raw[:index].decode("utf-8", errors="replace")
    return line_col(prefix, len(prefix))


def check_size(raw: bytes, label: str, limits: Limits = LIMITS, what: str = "a state file") -> None:
    if len(raw) > limits.max_bytes:
        line, col = byte_line_col(raw, limits.max_bytes)
        raise StateFileError([f"{label}:{line}:{col}: file too large: more than {limits.max_bytes} bytes "
                              f"({limits.max_bytes // 2**20} MiB), the limit of {what}; stopped reading here"])


_FILE_TYPES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> str | None:
    """What a file that is not a regular file is ("a FIFO (named pipe)"), None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    return next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """The path names something other than a regular file; `what` says what ("a FIFO (named pipe)")."""

    def __init__(self, what: str):
        import errno

        super().__init__(errno.EISDIR if what == "a directory" else errno.EINVAL, what)
        self.what = what


def open_regular(path: str) -> int:
    """A read-only descriptor of `path`, which must be a regular file (NotRegularFile otherwise).
    Only a regular file is opened: open(2) of a FIFO with no writer blocks for good, and a device
    may never end, or act on being opened (/dev/watchdog). O_NONBLOCK keeps open(2) from blocking
    should the name be swapped for a FIFO after the stat; the descriptor is checked again (fstat)."""
    what = not_regular(os.stat(path).st_mode)
    if what is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        what = not_regular(os.fstat(fd).st_mode)
        if what is None:
            return fd
        os.close(fd)
    raise NotRegularFile(what)


def read_regular(path: str, limit: int, own: bool = False) -> bytes:
    """At most `limit` bytes of a regular file (open_regular's rules). `own`: a file of
    instructions root acts on (a state file, a saved plan), which must be owned by root or the
    invoking user and not writable by group or others (UnsafeOwnFile otherwise: core/paths.py)."""
    with os.fdopen(open_regular(path), "rb") as fh:
        if own:
            from ...core.paths import check_own

            check_own(fh.fileno(), path)
        return fh.read(limit)


def read_bounded(path: str, label: str, limits: Limits = LIMITS, what: str = "a state file",
                 own: bool = False) -> bytes:
    """A file's bytes, reading at most one byte past the limit (so a huge file cannot exhaust
    memory), and only from a regular file (a FIFO or a device is refused before it is opened:
    reading one could hang or never end); StateFileError with a position for what cannot be read."""
    from ...core.paths import UnsafeOwnFile

    try:
        raw = read_regular(path, limits.max_bytes + 1, own)
    except UnsafeOwnFile as exc:
        raise StateFileError([f"{label}:1:1: {exc.why}"]) from None
    except FileNotFoundError:
        raise StateFileError([f"{label}:1:1: no such file"]) from None
    except NotRegularFile as exc:
        if exc.what == "a directory":
            raise StateFileError([f"{label}:1:1: is a directory, not {what}"]) from None
        hint = " (to read a state from a pipe, give `-` and send it on standard input)" \
            if what == "a state file" else ""
        raise StateFileError([f"{label}:1:1: is {exc.what}, not a regular file: {what} is read only from a "
                              f"regular file{hint}"]) from None
    except OSError as exc:
        raise StateFileError([f"{label}:1:1: cannot read: {exc.strerror or exc}"]) from None
    check_size(raw, label, limits, what)
    return raw


def decode(raw: bytes, label: str) -> str:
    """UTF-8 (a leading byte-order mark is dropped), or one line saying where it is not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, col = byte_line_col(raw, exc.start)
        raise StateFileError([f"{label}:{line}:{col}: not UTF-8 text (byte 0x{raw[exc.start]:02x})"]) from None
    return text[1:] if text.startswith("\ufeff") else text
