"""Text from the host or from another machine, made safe to print on a terminal.

Names and messages that reach the text report, `reconcile log`, the progress line and error
lines come from places other users control: unit and file names, process and container names,
a command's output, a remote target's report. A terminal obeys the control characters in them
(ESC starts a sequence that can retitle the window, clear the screen, move the cursor over what
was printed or, on some terminals, answer back into the input; CR and backspace overwrite a
line). So every such text goes out through `escape_controls` first; JSON output stays exact
(JSON escapes its own controls) and JUnit/Prometheus keep their own escaping.

The rule is systemd's `cescape()` (src/basic/escape.c, cescape_char): a byte below 0x20 or at
0x7f and above is written `\\xHH`; here for characters, so the C1 controls U+0080-U+009F
(xterm and others read them as CSI, OSC ... when they arrive UTF-8 encoded) are escaped too,
and printable non-ASCII text (a name in Cyrillic, an emoji) is left alone. Also escaped: the
Unicode bidirectional controls (U+200E/U+200F, U+202A-U+202E, U+2066-U+2069: the reordering of
CVE-2021-42574) and the line/paragraph separators U+2028/U+2029, as `\\uHHHH`; and a byte that
was not UTF-8 in a path (kept as a lone surrogate by os.fsdecode) as the `\\xHH` of that byte,
as GNU ls -b does for bytes that are not a character (coreutils quotearg.c); any other lone
surrogate (a remote report's JSON may carry one) as `\\uHHHH`, never a UnicodeEncodeError. A backslash is
left as it is: systemd's own unit names spell escaped bytes that way (`dev-disk-by\\x2duuid`),
so a name shows as systemd shows it; the exact text is in `--format json`.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_CONTROL_NOT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's surrogateescape: the byte it stands for
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: Any, newlines: bool = False) -> str:
    """`text` (str() of it) with its control characters written `\\xHH` (see the module's
    docstring for which); `newlines=True` keeps LF as it is, for a message of several lines
    printed as such (each line is still escaped)."""
    text = "" if text is None else str(text)
    pattern = _CONTROL_NOT_NEWLINE if newlines else _CONTROL
    return pattern.sub(_escape, text) if pattern.search(text) else text
