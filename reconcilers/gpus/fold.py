"""The kernel log folded as it streams by: each distinct driver fault once, with a count and its
first and last time, in memory bounded by the distinct faults, never by the log's length.

What "distinct" means (NVIDIA's tools call folding repeats de-duplication; NVSentinel #1120: a
sick node's 800,000 Xid 95 lines were 29 distinct faults): two lines are the same fault when
they have the same
- Xid number (or "fallen off the bus" without one),
- PCI device (domain:bus:device, as `pci_key` spells it) and MIG GPU instance,
- message after the number, with `pid=`/`name=` left out and hexadecimal values folded: `0x…`
  words and bare hex words of 8 digits or more (`Ch 00000008`, `faulted @ 0x73ac_1c000000`, an
  ESR register dump, Xid 62's raw words): where the fault happened, not which fault it is.
  What decides the step (xid.judge_xid, after NVIDIA's catalogue) stays apart: words (`RST: Yes`
  or `No`, Fatal or Nonfatal), decimal values (`caused by previous Xid 149`, GPC/TPC/SM, an RPC
  function number), and Xid 154's whole message (its new recovery action `to 0x2` is hex).

An event keeps the message of its first line; `varies` says later lines differed from it in
those hexadecimal values. What the fold holds between reads (kernel_log.py keeps it in a
record) is `state()`: the events, where each GPU was last initialised, and the line count.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .catalogue import step_text
from .observed import KernelEvent
from .xid import judge_xid, pci_key

_PCI = r"(?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_XID_RE = re.compile(r"NVRM: Xid \(" + _PCI + r"(?:\s+GPU-I:(\d+))?(?:\s+GPU-CI:(\d+))?\):\s*(\d+)\s*,?\s*(.*)")
_BDF = r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\.[0-7]"
_FALLEN_RES = (re.compile(r"NVRM: GPU " + _BDF + r": GPU has fallen off the bus"),
               re.compile(r"NVRM: GPU at (?:PCI:)?" + _BDF + r" has fallen off the bus"))
_PROBE_GPU = "NVRM: The NVIDIA GPU "
_PROBE_GPU_RE = re.compile(_PROBE_GPU + _BDF)
_LOAD = "NVRM: loading NVIDIA UNIX"  # a driver load: a fixed string
_LOAD_TAIL, _PROBE_TAIL = _LOAD[5:], _PROBE_GPU[5:]  # the same after `NVRM:`
_BOOT_RE = re.compile(r"\bLinux version \d")
_RESET = " was successfully reset"
_RESET_RE = re.compile(r"\bGPU " + _BDF + _RESET)
_PIDNAME_RE = re.compile(r"^pid=('[^']*'|[^,]*),\s*(name=[^,]*,\s*)?")
_HEX_RE = re.compile(r"\b0x[0-9a-fA-F_]+\b|\b(?=[0-9a-fA-F_]*[0-9])[0-9a-fA-F_]{8,}\b")
_WHEN_RES = (re.compile(r"\[\s*\d+\.\d+\]"),  # dmesg: seconds since boot
             re.compile(r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"),  # dmesg -T
             re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d+[+-]\d\d:?\d\d"),  # dmesg --time-format iso
             re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d"))  # syslog
# A kernel message counts only where it *starts* the record's message: after what the record's
# own source puts before it, and nothing else. The kernel quotes text a user chooses (fs/exec.c:
# "process '%s' launched '%s' with NULL argv"; security/yama/yama_lsm.c: "ptrace attach of
# \"%s\"[%d] was attempted by \"%s\"[%d]"), so an `NVRM:` met anywhere later in a line is a user's
# words, never a driver fault, a reset or a boot. The prefixes: a syslog priority, a /dev/kmsg
# record's own fields, dmesg -x's facility:level, the time as dmesg, dmesg -T, dmesg
# --time-format iso or syslog print it, a host and tag (`host kernel:`, journalctl's short
# formats) and the kernel's own time after it; a continuation line's indent.
_PREFIX = (r"[ \t]*(?:<\d{1,3}>)?(?:\d+,\d+,\d+,[^;\n]*;)?(?:[a-z]+ *:[a-z]+ *: )?"
           r"(?:\[[^\]\n]*\] ?|\d{4}-\d\d-\d\dT[0-9:.,+-]+ |[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )?"
           r"(?:(?:[\w.-]+ )?[\w.()/-]+(?:\[\d+\])?: )?(?:\[[^\]\n]*\] ?)?")
_PREFIX_RE = re.compile(_PREFIX)
# `.` stops at a newline; sre scans it faster than [^\n]
_TAIL_RE = re.compile(r"^" + _PREFIX + r"NVRM:(.*)", re.MULTILINE)


def starts_message(line: str, at: int) -> bool:
    """Whether what begins at AT in LINE begins the record's message (see _PREFIX)."""
    return at == 0 or _PREFIX_RE.fullmatch(line, 0, at) is not None
_PCI_KEYS: dict[str, str] = {}  # as printed -> pci_key: a machine has a few GPUs
CACHE_MAX = 1024  # messages remembered verbatim: repeats skip the regular expressions

# What an NVRM message is, remembered per message text (the part from `NVRM:` on).
_NOTHING = ("nothing",)
_LOAD_MARK = ("load",)
# Fields of an event while folding (a list, updated in place: one repeat costs no allocation).
PCI, XID, DETAIL, GI, FIRST, LAST, COUNT, LAST_N, VARIES = range(9)


def parse_kernel_log(text: str, mig_pcis: Iterable[str] = ()) -> tuple[tuple[KernelEvent, ...], str]:
    """Every distinct driver fault in TEXT, oldest first, repeats folded; and the last
    (re)initialisation line seen. The machine's kernel log is streamed into a LogFold instead
    (kernel_log.py), never held whole: this is for a text at hand."""
    fold = LogFold()
    fold.feed(text.splitlines())
    return fold.kernel_events(mig_pcis), fold.last_init


def when(head: str) -> str:
    """The time a line's prefix (what comes before `NVRM:`) prints, in whichever form it has."""
    for rx in _WHEN_RES:
        m = rx.search(head)
        if m:
            return m.group(0)
    return ""


class LogFold:
    """Feed it the kernel log's lines in order (`feed`), any number of times; `events()` says what
    they held. Holds the events and a bounded cache, never the lines."""

    def __init__(self, state: dict[str, Any] | None = None):
        self.lines = 0  # lines fed, over every read this fold has seen
        self.events: dict[tuple, list] = {}  # fold key -> event fields (PCI..VARIES), in first-seen order
        self.init_all = -1  # line number of the last boot or driver load
        self.init_gpu: dict[str, int] = {}  # pci -> line number of its last reset
        self.last_init = ""
        self.probe_pci: str | None = None  # "The NVIDIA GPU <bdf>" waiting for its "fallen off the bus"
        self.probe_left = 0
        self.lost = ""  # lines the source lost before they were read: "between X and Y"
        self.lost_at = -1  # the line count when they were lost
        self._cache: dict[str, tuple] = {}
        if state:
            self.lines = int(state["lines"])
            self.init_all = int(state["init_all"])
            self.init_gpu = {str(k): int(v) for k, v in state["init_gpu"].items()}
            self.last_init = str(state["last_init"])
            self.probe_pci, self.probe_left = state.get("probe_pci"), int(state.get("probe_left", 0))
            self.lost, self.lost_at = str(state.get("lost", "")), int(state.get("lost_at", -1))
            for fields in state["events"]:
                self.events[_fold_key(fields[PCI], fields[XID], fields[DETAIL], fields[GI])] = list(fields)

    def state(self) -> dict[str, Any]:
        """What a later read needs to go on from here (JSON-able; bounded by the distinct faults)."""
        return {"lines": self.lines, "init_all": self.init_all, "init_gpu": self.init_gpu,
                "last_init": self.last_init, "probe_pci": self.probe_pci, "probe_left": self.probe_left,
                "lost": self.lost, "lost_at": self.lost_at,
                "events": list(self.events.values())}

    def gap(self, what: str) -> None:
        """Lines were lost here (WHAT says which): until the next boot or driver load, a fault may
        have been among them."""
        self.lost = f"{self.lost}; {what}" if self.lost and self.lost_at > self.init_all else what
        self.lost_at = self.lines

    def lost_since_init(self) -> str:
        """The lost lines that still matter: those after the last boot or driver load."""
        return self.lost if self.lost and self.lost_at >= self.init_all else ""

    def feed(self, lines: list[str] | None = None, text: str | None = None) -> None:
        """Fold the next lines, in order: LINES, or TEXT (lines joined by newlines), or both."""
        if text is None:
            if not lines:
                return
            text = "\n".join(lines)
        if self.probe_left or "NVRM:" not in text:
            if self.probe_left or "Linux version " in text or _RESET in text:
                self._feed_each(lines if lines is not None else text.split("\n"))
            else:
                self.lines += len(lines) if lines is not None else text.count("\n") + 1
            return
        if "Linux version " in text or _RESET in text or not self._feed_counted(
                text, len(lines) if lines is not None else text.count("\n") + 1):
            # a boot, driver load, reset or probe message: where each line is matters
            self._feed_each(lines if lines is not None else text.split("\n"))

    def _feed_counted(self, text: str, count: int) -> bool:
        """COUNT lines with no (re)initialisation among them: where a fault falls between them does
        not change whether it is current, so each distinct message is counted at C speed (a storm
        of 800,000 lines is a few dozen messages), judged once, and its first and last line looked
        up for their times."""
        tails = _TAIL_RE.findall(text)
        counts = Counter(tails)  # each distinct message once, in the order each first appears
        if any(tail.startswith((_LOAD_TAIL, _PROBE_TAIL)) for tail in counts):
            return False  # a driver load or a probe message: a line at a time (nothing was folded yet)
        self.lines += count
        n = self.lines  # every fault here is after the last (re)initialisation and before the next
        cache, events = self._cache, self.events
        key_of: dict[str, tuple] = {}  # message -> fold key, for the faults here
        for tail, times in counts.items():
            hit = cache.get(tail) or self._classify(tail, cache)
            if hit is _NOTHING or hit is _LOAD_MARK or hit[0] == "reset":
                continue  # (a load or reset would have sent these lines to _feed_each)
            key, detail = hit[1], hit[2]
            ev = events.get(key)
            if ev is None:
                head = _head(text, _line_of(text, "NVRM:" + tail, last=False))
                ev = events[key] = [key[0], key[1], detail, key[2], head, head, 0, n, False]
            ev[COUNT] += times
            if detail != ev[DETAIL]:
                ev[VARIES] = True
            key_of[tail] = key
        # Each fault's latest line: walk back from the end until every fault here is met (in a
        # storm, within a few lines; never more than the block).
        unmet = set(key_of.values())
        for tail in reversed(tails):
            key = key_of.get(tail)
            if key in unmet:
                unmet.discard(key)
                ev = events[key]
                ev[LAST], ev[LAST_N] = _head(text, _line_of(text, "NVRM:" + tail, last=True)), n
                if not unmet:
                    break
        return True

    def _feed_each(self, lines: Iterable[str]) -> None:
        # A line at a time: a fixed-string test first (a kernel log is mostly other lines), then
        # the message looked up verbatim (a storm repeats it).
        n = self.lines
        cache = self._cache
        events = self.events
        for line in lines:
            n += 1
            i = line.find("NVRM:")
            if i > 0 and not starts_message(line, i):
                i = -1  # a user's words quoted by the kernel: not the driver's
            if i < 0:
                if "Linux version " in line:
                    m = _BOOT_RE.search(line)
                    if m and starts_message(line, m.start()):
                        self.init_all, self.last_init = n, line.strip()
                elif _RESET in line:
                    m = _RESET_RE.search(line)
                    if m and starts_message(line, m.start()):
                        self.init_gpu[pci_key(m.group(1))] = n
                continue
            msg = line[i + 5:]
            hit = cache.get(msg) if not self.probe_left else None
            if hit is None:
                hit = self._classify(msg, cache)
            if hit is _NOTHING:
                continue
            if hit is _LOAD_MARK:
                self.init_all, self.last_init = n, line.strip()
                continue
            if hit[0] == "reset":
                self.init_gpu[hit[1]] = n
                continue
            key, detail = hit[1], hit[2]
            ev = events.get(key)
            if ev is None:
                head = line[:i]
                events[key] = [key[0], key[1], detail, key[2], head, head, 1, n, False]
                continue
            ev[COUNT] += 1
            ev[LAST] = line[:i]
            ev[LAST_N] = n
            if detail != ev[DETAIL] and not ev[VARIES]:
                ev[VARIES] = True
        self.lines = n

    def _classify(self, tail: str, cache: dict[str, tuple]) -> tuple:
        """What the message `NVRM:TAIL` is: nothing, a driver load, a GPU reset, or a fault (its fold
        key and message). Remembered unless it depends on the lines around it (the probe message's
        three lines)."""
        msg = "NVRM:" + tail
        found: tuple[str, int | None, str, int | None] | None = None
        stateful = False
        if msg.startswith(_LOAD):
            out: tuple = _LOAD_MARK
        elif _RESET in msg and _RESET_RE.match(msg, 6):
            out = ("reset", pci_key(_RESET_RE.match(msg, 6).group(1)))
        else:
            m = _XID_RE.match(msg)
            if m:
                detail = m.group(5).strip()
                if detail.startswith("pid="):
                    detail = _PIDNAME_RE.sub("", detail).strip()
                pci = _PCI_KEYS.get(m.group(1)) or _PCI_KEYS.setdefault(m.group(1), pci_key(m.group(1)))
                found = (pci, int(m.group(4)), detail, int(m.group(2)) if m.group(2) else None)
            else:
                for rx in _FALLEN_RES:
                    fm = rx.match(msg)
                    if fm:
                        found = (pci_key(fm.group(1)), None, "", None)
                        break
                pm = _PROBE_GPU_RE.match(msg) if msg.startswith(_PROBE_GPU) else None
                stateful = pm is not None or self.probe_left > 0
                if pm:
                    self.probe_pci, self.probe_left = pci_key(pm.group(1)), 3
                    if "fallen off the bus" not in msg:
                        return _NOTHING
                if found is None and self.probe_pci and self.probe_left > 0:
                    self.probe_left -= 1
                    if "fallen off the bus" in msg:
                        found = (self.probe_pci, None, "", None)
                        self.probe_pci, self.probe_left = None, 0
            if found is None:
                out = _NOTHING
            else:
                pci, xid, detail, gi = found
                out = ("event", _fold_key(pci, xid, detail, gi), detail)
        if not stateful:
            if len(cache) >= CACHE_MAX:
                cache.clear()  # lines with unique addresses: the cache stays bounded
            cache[tail] = out
        return out

    def kernel_events(self, mig_pcis: Iterable[str] = ()) -> tuple[KernelEvent, ...]:
        """Every distinct fault, oldest first, with NVIDIA's verdict and whether it is current (since
        that GPU was last initialised). MIG_PCIS: GPUs with MIG on (Xid 63/64 then stand for NVML's
        remap signal)."""
        mig = {pci_key(p) for p in mig_pcis}
        out = []
        for ev in self.events.values():
            pci = ev[PCI]
            current = ev[LAST_N] > self.init_all and ev[LAST_N] > self.init_gpu.get(pci, -1)
            keep_off, action, why = judge_xid(ev[XID], ev[DETAIL], pci in mig)
            first = when(ev[FIRST])
            out.append(KernelEvent(pci=pci, xid=ev[XID], detail=ev[DETAIL], first=first,
                                   last=when(ev[LAST]) or first, count=ev[COUNT], gpu_instance=ev[GI],
                                   current=current, keep_off=keep_off, action=action, step=step_text(action),
                                   why=why, varies=ev[VARIES]))
        return tuple(out)


def _line_of(text: str, needle: str, last: bool) -> int:
    """Where NEEDLE ends a line of TEXT, first or last (a longer message may begin with it)."""
    start, end = 0, len(text)
    while True:
        at = text.rfind(needle, start, end) if last else text.find(needle, start, end)
        if at < 0:
            return -1
        stop = at + len(needle)
        if stop == len(text) or text[stop] == "\n":
            return at
        if last:
            end = stop - 1
        else:
            start = at + 1


def _head(text: str, at: int) -> str:
    """What comes before `NVRM:` at AT on its line (the time)."""
    return text[text.rfind("\n", 0, at) + 1:at] if at >= 0 else ""


def _fold_key(pci: str, xid: int | None, detail: str, gi: int | None) -> tuple:
    # Xid 154's message is the new recovery action (`to 0x2`), which decides the step: never folded.
    return (pci, xid, gi, detail if xid == 154 else _HEX_RE.sub("0x_", detail))
