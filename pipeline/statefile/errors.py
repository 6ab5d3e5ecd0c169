"""The one error a state file (or an inventory, or a plan) can raise while it is read."""

from __future__ import annotations

Position = tuple[int, int]  # 1-based line, column


class StateFileError(Exception):
    """One or more problems, each already formatted as `file:line:col: message`; `warnings`, the
    file's `file:line:col: warning: ...` lines found before it failed (old spellings), printed with them."""

    def __init__(self, problems: list[str], warnings: tuple[str, ...] = ()):
        super().__init__("\n".join(problems))
        self.problems = problems
        self.warnings = warnings

    def lines(self) -> list[str]:
        """Warnings and problems together, in the file's order (as a compiler prints them)."""
        return sorted([*self.warnings, *self.problems], key=position_of)


def position_of(line: str) -> tuple[int, int]:
    """(line, column) of a `file:line:col: ...` line; the file's label may itself hold colons."""
    import re

    m = re.match(r"(?:.*?):(\d+):(\d+): ", line)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)
