"""The fenced blocks of README.md, CONTRIBUTING.md and docs/*.md, as a reader finds them.

A block is a fragment when the line directly above its opening fence is `<!-- fragment -->`
(CONTRIBUTING.md, "Writing docs"): it is not run. Every other shell or YAML block is run or
validated by tests/test_docs.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAGMENT = "<!-- fragment -->"
SHELL = {"sh", "shell", "bash", "console"}
YAML = {"yaml", "yml"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it opens (1-based), its info string, its lines, and the marker."""

    file: str
    line: int
    lang: str
    lines: tuple[str, ...]
    fragment: bool

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def is_shell(self) -> bool:
        """sh/console blocks, and untagged ones that open with a `$ ` prompt (a session shown)."""
        return self.lang in SHELL or (not self.lang and bool(self.lines) and self.lines[0].startswith("$ "))

    @property
    def is_yaml(self) -> bool:
        return self.lang in YAML

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence[0] * len(fence)):
            j += 1
        body = tuple(line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j])
        out.append(Block(str(path.relative_to(ROOT)), i + 1, lang.lower(), body,
                         i > 0 and lines[i - 1].strip() == FRAGMENT))
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks(path)]


def strip_comment(command: str) -> str:
    """COMMAND without a trailing `# comment` (a `#` after whitespace, outside quotes)."""
    quote = ""
    for k, ch in enumerate(command):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or command[k - 1].isspace()):
            return command[:k].rstrip()
    return command.rstrip()


@dataclass(frozen=True)
class Command:
    """One command as pasted (continuation lines joined), its expected exit status (a trailing
    `# exit N` comment says so; else 0) and, in a `$ ` session, the output shown after it."""

    text: str
    exit: int
    output: tuple[str, ...]


EXIT = re.compile(r"#\s*exit\s+(\d+)")


def commands(block: Block) -> list[Command]:
    session = block.lines and block.lines[0].startswith("$ ")
    out: list[Command] = []
    k = 0
    lines = block.lines
    while k < len(lines):
        line = lines[k]
        if session and not line.startswith("$ "):
            k += 1
            continue
        raw = line[2:] if session else line
        k += 1
        while raw.rstrip().endswith("\\") and k < len(lines):
            raw = raw.rstrip()[:-1] + " " + lines[k].strip()
            k += 1
        output = []
        if session:
            while k < len(lines) and not lines[k].startswith("$ "):
                output.append(lines[k])
                k += 1
        text = strip_comment(raw)
        if not text.strip():
            continue
        m = EXIT.search(raw[len(text):])
        out.append(Command(text.strip(), int(m.group(1)) if m else 0, tuple(output)))
    return out


def output_matches(shown: tuple[str, ...], printed: str) -> bool:
    """The output a doc shows, against what was printed: a line `...` stands for any lines, and
    each run of digits for any digits (times, counts, PIDs); the rest must be as shown."""
    pattern = []
    for line in shown:
        if line.strip() in ("...", "…"):
            pattern.append(r"(?:.*\n)*?")
            continue
        pattern.append(r"\d+".join(re.escape(part) for part in re.split(r"\d+", line.rstrip())) + r"[ \t]*\n")
    text = "".join(line.rstrip() + "\n" for line in printed.splitlines())
    return re.fullmatch("".join(pattern) + r"\n*", text) is not None
