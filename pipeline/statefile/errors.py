"""The one error a state file (or an inventory, or a plan) can raise while it is read."""

from __future__ import annotations

Position = tuple[int, int]  # 1-based line, column


class StateFileError(Exception):
    """One or more problems, each already formatted as `file:line:col: message`."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems
