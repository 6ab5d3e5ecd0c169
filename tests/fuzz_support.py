"""The fuzzer's two halves: a seeded generator of hostile inputs, and a runner that feeds them to
reconcile in forked children, each input under a time and memory bound.

Generator: mutations of seed texts (the shipped states/, the docs' YAML examples): byte flips,
deletions, duplications, indentation shifts, tabs, type swaps, and injections of the classes
of hostile YAML (merge keys, tags, anchors and aliases, alias bombs, deep nesting, several
documents, colliding and non-string keys, numbers at the edges, control characters, invalid
UTF-8, BOM, very long lines and keys). The same seed gives the same inputs.

Runner: chunks of inputs go to a forked child with RLIMIT_AS set; each input runs under
SIGALRM. The child reports one line per input; a child that dies (a segfault, the memory
limit) is noticed by the parent, the input it was on is recorded as a crash, and a new child
goes on with the next one.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def seed_texts() -> list[str]:
    """The shipped state files and every ```yaml block of the docs and the README."""
    texts = [p.read_text() for p in sorted((REPO / "states").glob("*.yaml"))]
    for md in sorted([*(REPO / "docs").glob("*.md"), REPO / "README.md"]):
        texts += re.findall(r"```yaml\n(.*?)```", md.read_text(), re.S)
    # A snippet without its version line would stop at the first check: give it one.
    return [t if re.search(r"^version:", t, re.M) or "hosts:" in t else "version: 1\n" + t for t in texts]


EDGE_VALUES = [
    "0", "-1", "1", "8.0", "0.5", "-0.5", "1e308", "1e999", "-1e999", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "9" * 30, "9" * 5000, ".inf", "-.inf", ".nan", "true",
    "null", "~", '""', "''", "yes", "0x7fffffffffffffffff", "0o777", "0b101", "_", "-_", "1_000",
    '"-1s"', '"1e400s"', '"' + "9" * 400 + 'GiB"', '"' + "9" * 400 + 'd"', '"101%"', '"100%"', '"-5%"',
    '"1.5"', '"0s"', '"99999999999999999999d"', '"a\\nb.service"', '"a/b.service"', '"a\\x00b.service"',
    "[]", "{}", "[1, [2, [3]]]", "{a: 1}", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "!!binary aGk=",
    "!!omap [a: 1, b: 2]", "!!pairs [a: 1]", "!!set {a, b}", "!!python/object/apply:os.system [ls]",
    "!unknown x", "!!str 5", "!!int '5'", "&a false", "&b 5", "*nope", "'x' 'y'", "x" * 300,
    '"' + "é" * 2000 + '"', "|\n  block\n  text", ">-\n  folded",
]


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True) or ["\n"]


def m_byte_flip(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data or b" ")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_delete(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    return data[:i] + data[i + rng.randint(1, 20):]


def m_delete_line(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    del lines[rng.randrange(len(lines))]
    return "".join(lines)


def m_duplicate(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    j = min(len(lines), i + rng.randint(1, 4))
    return "".join(lines[:j] + lines[i:j] + lines[j:])


def m_indent(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    n = rng.choice([-3, -2, -1, 1, 2, 3, 8])
    lines[i] = " " * n + lines[i] if n > 0 else lines[i][min(-n, len(lines[i]) - len(lines[i].lstrip(" "))):]
    return "".join(lines)


def m_tab(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.randrange(len(lines))
    stripped = lines[i].lstrip(" ")
    lines[i] = rng.choice(["\t", "  \t", "\t\t"]) + stripped if rng.random() < 0.7 else lines[i].replace(" ", "\t", 1)
    return "".join(lines)


_VALUE_LINE = re.compile(r"^(\s*(?:- )?[^#\s][^:#\n]*:)[ \t]+(\S.*)$", re.M)


def m_type_swap(rng: random.Random, text: str) -> str:
    spots = list(_VALUE_LINE.finditer(text))
    if not spots:
        return text + f"x: {rng.choice(EDGE_VALUES)}\n"
    m = rng.choice(spots)
    value = rng.choice(EDGE_VALUES)
    if "\n" in value:  # a block scalar: indent its lines under the key
        indent = " " * (len(m.group(1)) - len(m.group(1).lstrip()) + 2)
        value = value.replace("\n", "\n" + indent)
    return text[:m.start(2)] + value + text[m.end(2):]


def m_key_swap(rng: random.Random, text: str) -> str:
    """A key becomes a number, a boolean, null, a collection, a long or control-laden name."""
    spots = list(re.finditer(r"^(\s*)([A-Za-z0-9_./@-]+):", text, re.M))
    if not spots:
        return text
    m = rng.choice(spots)
    key = rng.choice(["1", "'1'", "true", "null", "~", "1.5", "? [a, b]\n" + m.group(1), "{a: 1}", "[x]",
                      "x" * rng.choice([200, 1100, 3000]) + ".service", '"a\\nb.service"', '"a/b.service"',
                      '"\\x01.service"', "<<", "'<<'", "*nope", "&k key", "!!str k"])
    return text[:m.start(2)] + key + text[m.end(2):]


def m_bomb(rng: random.Random, text: str) -> str:
    levels, width = rng.randint(3, 10), rng.randint(2, 10)
    out = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        out.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "version: 1\n" + "\n".join(out) + "\n" + (text if rng.random() < 0.3 else "")


def m_deep(rng: random.Random, text: str) -> str:
    n = rng.choice([50, 64, 65, 100, 1000, 5000, 100000])
    if rng.random() < 0.5:
        return f"version: 1\nunits: {'[' * n}{']' * n}\n"
    return "version: 1\nx:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, min(n, 3000))) + "\n"


def m_merge(rng: random.Random, text: str) -> str:
    spots = list(re.finditer(r"^  ([A-Za-z0-9_.@/-]+):\n", text, re.M))
    base = rng.choice(["{active: false}", "{activ: true}", "[1, 2]", "5", "{active: false, enabled: false}",
                       "{mounted: true}", "{total: 10}"])
    prefix = f"_defaults: &d {base}\n" if rng.random() < 0.5 else ""
    if not spots:
        return prefix + text
    m = rng.choice(spots)
    merged = rng.choice(["    <<: *d\n", "    <<: [*d, *d]\n", "    <<: {active: true}\n", "    <<: *missing\n",
                         "    <<: 5\n", "    <<: [*d, 1]\n"])
    out = text[:m.end()] + merged + text[m.end():]
    if prefix and rng.random() < 0.5:  # the anchor on a value of the document itself
        out = out.replace(m.group(0), f"  {m.group(1)}: &d\n", 1).replace("_defaults: &d", "_defaults:", 1)
    return prefix + out if "&d" not in out else out


def m_alias(rng: random.Random, text: str) -> str:
    spots = list(_VALUE_LINE.finditer(text))
    if len(spots) < 2:
        return text
    a, b = rng.sample(spots, 2)
    first, second = sorted((a, b), key=lambda m: m.start())
    return (text[:first.start(2)] + "&x " + first.group(2) + text[first.end(2):second.start(2)] + "*x"
            + text[second.end(2):]) if rng.random() < 0.8 else text[:first.start(2)] + "*x" + text[first.end(2):]


def m_multidoc(rng: random.Random, text: str) -> str:
    return rng.choice([text + "---\n" + text, "---\n" + text + "...\n", text + "---\n", text + "...\n---\nx: 1\n",
                       "%YAML 1.1\n---\n" + text, "%YAML 1.2\n---\n" + text, "%TAG !e! tag:example.com,2000:\n---\n"
                       + text])


def m_collide(rng: random.Random, text: str) -> str:
    return text + rng.choice(["1: a\n'1': b\n", "version: 1\n", "units:\n  a.service: {active: true}\n"
                              "  'a.service': {active: false}\n", "true: x\n'true': y\n", "null: x\n"])


def m_bytes(rng: random.Random, data: bytes) -> bytes:
    i = rng.randrange(len(data) + 1)
    junk = rng.choice([b"\x00", b"\x01", b"\x07", b"\x1b[31m", b"\x7f", b"\xc2\x80", b"\xff", b"\xc3", b"\xed\xa0\x80",
                       b"\xef\xbb\xbf", b"\r", b"\r\n", b"\xe2\x80\xa8", b"\xc2\x85", b"\xfe\xff"])
    if rng.random() < 0.2:
        return b"\xef\xbb\xbf" + data  # a BOM
    return data[:i] + junk + data[i:]


def m_long(rng: random.Random, text: str) -> str:
    n = rng.choice([10_000, 100_000, 1_000_000])
    return rng.choice([text + "# " + "x" * n + "\n", text + "long: " + "y" * n + "\n",
                       text + "k" * n + ": 1\n", text + f"x: \"{'z' * n}\"\n"])


TEXT_MUTATORS: list[Callable[[random.Random, str], str]] = [
    m_delete_line, m_duplicate, m_indent, m_tab, m_type_swap, m_type_swap, m_key_swap, m_merge, m_alias,
    m_multidoc, m_collide]
BYTE_MUTATORS: list[Callable[[random.Random, bytes], bytes]] = [m_byte_flip, m_delete, m_bytes]
RARE_MUTATORS: list[Callable[[random.Random, str], str]] = [m_bomb, m_deep, m_long]


def state_inputs(seed: int, count: int, seeds: list[str] | None = None) -> Iterator[bytes]:
    """`count` inputs, the same ones for the same seed."""
    rng = random.Random(seed)
    seeds = seeds or seed_texts()
    for _ in range(count):
        text = rng.choice(seeds)
        if rng.random() < 0.05:
            text = rng.choice(RARE_MUTATORS)(rng, text)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            text = rng.choice(TEXT_MUTATORS)(rng, text)
        data = text.encode("utf-8", errors="surrogatepass")
        if rng.random() < 0.3:
            data = rng.choice(BYTE_MUTATORS)(rng, data)
        yield data


# --- the runner -----------------------------------------------------------------------------


class Hang(Exception):
    pass


def _on_alarm(_signum, _frame):
    raise Hang


def _child(inputs: list[bytes], start: int, check: Callable[[bytes], str], out_fd: int, seconds: int,
           memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    signal.signal(signal.SIGALRM, _on_alarm)
    with os.fdopen(out_fd, "w") as out:
        for i in range(start, len(inputs)):
            out.write(json.dumps({"i": i, "started": True}) + "\n")
            out.flush()
            signal.alarm(seconds)
            try:
                verdict = check(inputs[i])
            except Hang:
                verdict = f"hang: more than {seconds}s"
            except BaseException:
                verdict = "exception:\n" + traceback.format_exc(limit=12)
            finally:
                signal.alarm(0)
            out.write(json.dumps({"i": i, "verdict": verdict}) + "\n")
            out.flush()
    os._exit(0)


def run_all(inputs: list[bytes], check: Callable[[bytes], str], *, seconds: int = 20,
            memory: int = 3 * 2**30, workers: int = 2) -> dict[int, str]:
    """check(input) -> "" (fine) or what is wrong, for every input; {index: problem} of the bad ones.
    `workers` children share the inputs (by index modulo); a child that dies is replaced, one that
    stops answering (stuck where SIGALRM cannot reach, e.g. inside a regular expression) is killed."""
    import select

    bad: dict[int, str] = {}
    shards = [list(range(w, len(inputs), workers)) for w in range(workers)]
    running = {w: _start(inputs, shard, 0, check, seconds, memory) for w, shard in enumerate(shards) if shard}
    while running:
        by_fd = {st["fh"].fileno(): w for w, st in running.items()}
        ready, _, _ = select.select(list(by_fd), [], [], seconds * 3)
        if not ready:  # nobody said anything for three alarms' time: kill the silent ones
            for st in running.values():
                os.kill(st["pid"], signal.SIGKILL)
                st["hung"] = True
            continue
        for fd in ready:
            w = by_fd[fd]
            st = running[w]
            line = st["fh"].readline()
            if line:
                msg = json.loads(line)
                if "verdict" in msg:
                    if msg["verdict"]:
                        bad[st["shard"][msg["i"]]] = msg["verdict"]
                    st["pos"] = msg["i"] + 1
                else:
                    st["pos"] = msg["i"]
                continue
            _, status = os.waitpid(st["pid"], 0)
            st["fh"].close()
            del running[w]
            pos, shard = st["pos"], st["shard"]
            if pos < len(shard) and status != 0:  # it died on shard[pos]
                bad[shard[pos]] = ("hang: no answer, killed" if st.get("hung") else
                                   f"crash: child ended with status {status} (signal {status & 0x7f})")
                pos += 1
            if pos < len(shard):
                running[w] = _start(inputs, shard, pos, check, seconds, memory)
    return bad


def _start(inputs, shard, pos, check, seconds, memory):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _child([inputs[i] for i in shard], pos, check, w, seconds, memory)
        finally:
            os._exit(3)
    os.close(w)
    return {"pid": pid, "fh": os.fdopen(r), "shard": shard, "pos": pos}
