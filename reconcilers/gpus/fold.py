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
from collections.abc import Iterable, Iterator
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
# own source puts before it, and nothing else. The kernel quotes text a user chooses (fs/exec.c,
# do_execveat_common(): "process '%s' launched '%s' with NULL argv: empty string added";
# security/yama/yama_lsm.c, __report_access(): "ptrace %s of \"%s\"[%d] was attempted by
# \"%s\"[%d]"), so an `NVRM:` met anywhere later in a line is a user's words, never a driver
# fault, a reset or a boot. The prefixes: a syslog priority, a /dev/kmsg record's own fields,
# dmesg -x's facility:level, the time as dmesg, dmesg -T, dmesg --time-format iso or syslog print
# it, the host and the kernel's tag (`host kernel:`: journalctl's short formats, rsyslog; a
# kernel record has no other tag) and the kernel's own time after it.
_TIME = (r"(?:<\d{1,3}>)?(?:\d+,\d+,\d+,[^;\n]*;)?(?:[a-z]+ *:[a-z]+ *: )?"
         r"(?:\[[^\]\n]*\] ?|\d{4}-\d\d-\d\dT[0-9:.,+-]+ |[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )?")
_PREFIX = _TIME + r"(?:(?:[\w.-]+ )?kernel: )?(?:\[[^\]\n]*\] ?)?"
_PREFIX_RE = re.compile(_PREFIX)
# nvidia-smi's reset words reach the log through `tee /dev/kmsg` (user facility): tagged with
# whatever the writer was (`host root:`), still at the start of the record's message.
_USER_PREFIX_RE = re.compile(_TIME + r"(?:(?:[\w.-]+ )?[\w.()/-]+(?:\[\d+\])?: )?(?:\[[^\]\n]*\] ?)?")
# The block path's regular expressions, each led by a literal (sre scans for it in C).
# `pid=…, name=…,` where the driver prints them, right after the Xid number (NVIDIA's format:
# `NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, %s`), made
# empty (_NO_PID, which _PIDNAME_RE then leaves out of the message once, as it leaves out the
# real ones on the line path: what follows them may itself begin with `pid=`); a line with
# another spacing, or with no name=, keeps them (it then has a form of its own, judged whole).
# Only the `): NN, ` before them is looked at, not the whole header: what follows `name=` is the
# process's name, at most 15 bytes (TASK_COMM_LEN), too short to hold another `): N, pid=…,name=…,`
# of its own, and the driver's message after it holds no `pid=`.
_NO_PID = "pid=, name=, "
_PID_BLOCK_RE = re.compile(r"pid=(?:(?<=\): \d\d, pid=)|(?<=\): \d\d\d, pid=)|(?<=\): \d, pid=))"
                           r"(?:'[^'\n]*'|[^,\n]*),[^\S\n]*name=[^,\n]*,[^\S\n]*")
# One item for every line of a block (the block gets a newline before its first line), by one
# pass of one regular expression: the message after `NVRM:` where the line begins with a prefix
# the record's source puts there and holds no `NVRM:` before it, so that `NVRM:` begins the
# record's message (as starts_message says); "" for every other line. A line that begins with
# white space (a record's later line) never begins with a prefix. The common shapes first, each
# on its own: dmesg's and /dev/kmsg's `[time] `, journalctl's `[time] host kernel: ` (a bracket
# with a capital V in it is left to the next); a line with `NVRM:` anywhere else is kept whole
# and the block is read again with the next shape, the last all of _PREFIX, with no `NVRM:`
# inside its brackets and fields: a line it does not begin holds `NVRM:` only in a quote.
_NO_V = r"[^\]\nV]*+"
_NOT_NVRM = r"(?:[^{}\nN]|N(?!VRM:))"
_ANY_PREFIX = _PREFIX.replace(r"[^\]\n]", _NOT_NVRM.format(r"\]")).replace(r"[^;\n]", _NOT_NVRM.format(";"))
_ITEM_RES = (re.compile(r"\n(?:\[" + _NO_V + r"\] NVRM:|(?=[^\n]*NVRM:)|[^\n]*)(.*)"),
             re.compile(r"\n(?:\[" + _NO_V + r"\] [\w.-]++ kernel: NVRM:|(?=[^\n]*NVRM:)|[^\n]*)(.*)"),
             re.compile(r"\n(?:" + _ANY_PREFIX + r"NVRM:|[^\n]*)(.*)"))
_INIT_TAILS = (" loading NVIDIA UNIX", " The NVIDIA GPU ")  # _LOAD and _PROBE_GPU after `NVRM:`
# Part of what _HEX_RE folds, never more: its `0x…` words (led by the literal, the word boundary
# checked behind it), not Xid 154's recovery actions (`from 0x0 (None) to 0x1`), which decide the
# step. Bare hexadecimal words are left as they are: a form is then finer than a fault, never
# coarser (two forms of one fault are one event).
_HEX_BLOCK_RE = re.compile(r"0x(?<!\w0x)(?<!from 0x)(?<!to 0x)[0-9a-fA-F_]+\b")


def starts_message(line: str, at: int, prefix: re.Pattern[str] = _PREFIX_RE) -> bool:
    """Whether what begins at AT in LINE begins the record's message (see _PREFIX)."""
    return at == 0 or prefix.fullmatch(line, 0, at) is not None


_INDENT = (" ", "\t")
_INIT_WORDS = ("Linux version ", _RESET, _LOAD, _PROBE_GPU)
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
        self._in_driver = False  # the record the last unindented line began was the driver's
        self._shape = 0  # which of _ITEM_RES the last block read by the block path had
        if state:
            self.lines = int(state["lines"])
            self.init_all = int(state["init_all"])
            self.init_gpu = {str(k): int(v) for k, v in state["init_gpu"].items()}
            self.last_init = str(state["last_init"])
            self.probe_pci, self.probe_left = state.get("probe_pci"), int(state.get("probe_left", 0))
            self._in_driver = self.probe_left > 0  # only the probe message's lines are waited for
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
        """Fold the next lines, in order: LINES, or TEXT (lines joined by newlines), or both.

        The lines where a GPU starts afresh (a boot, a driver load, a reset, the probe message) are
        folded one at a time, where they are; the runs of lines between them by blocks
        (_feed_counted), where the order of faults does not change whether they are current."""
        if text is None:
            if not lines:
                return
            text = "\n".join(lines)
        if not self.probe_left and "NVRM:" in text and self._feed_counted(text):
            return  # a storm's block: no (re)initialisation among its lines
        at = 0
        for start, stop in _init_spans(text):
            if start > at:
                self._feed_run(text[at:start - 1])  # (the newline before START left out)
            self._feed_each(text[start:stop].split("\n"))
            at = stop + 1
        if at <= len(text):
            self._feed_run(text[at:] if at else text)

    def _feed_run(self, text: str) -> None:
        """Lines with no (re)initialisation among them."""
        if self.probe_left:  # the probe message's next lines: one at a time, until it is read
            at = 0
            while self.probe_left and at <= len(text):
                stop = text.find("\n", at)
                stop = len(text) if stop < 0 else stop
                self._feed_each((text[at:stop],))
                at = stop + 1
            if at > len(text):
                return
            text = text[at:]
        if "NVRM:" not in text:
            self.lines += text.count("\n") + 1
        elif not self._feed_counted(text):
            self._feed_each(text.split("\n"))

    def _feed_counted(self, text: str) -> bool:
        """The lines of TEXT counted by what makes them one fault, at C speed over the whole block,
        never by Python per line (a storm of 800,000 lines, each from a process of its own, is 29
        faults): where a fault falls among them does not change whether it is current, as long
        as no GPU starts afresh among them. False, with nothing folded, where one may (a boot, a
        driver load, a reset, the probe message: the caller reads the block around those lines)
        or where a form must be read a line at a time (an Xid 154 whose values vary where the fold
        key does not fold).

        Two passes of regular expressions over the block, each led by a literal: `pid=`/`name=`
        after the Xid number made empty (_PID_BLOCK_RE, as the fold key leaves them out: a storm's
        lines differ in them one by one), then one item a line (_ITEM_RES, the log's own shape first: the
        driver's message, or ""), which also counts the lines. One Counter counts the items.
        What still varies, the hexadecimal values the fold key folds, is folded per distinct item
        (_HEX_BLOCK_RE: a part of what _HEX_RE folds, so two lines of one form are always one
        fault). Each form is judged once, from its first line's message (the message the line
        path keeps); only a form's first and last line are looked up, for their times. `varies`:
        a form met with more than one message."""
        if "Linux version " in text or _RESET in text:
            return False  # a boot, or a GPU reset
        plain = "\n" + _PID_BLOCK_RE.sub(_NO_PID, text)
        for shape in (self._shape, *(s for s in range(len(_ITEM_RES)) if s != self._shape)):
            items = _ITEM_RES[shape].findall(plain)
            counts = Counter(items)
            if shape == len(_ITEM_RES) - 1 or not any("NVRM:" in item for item in counts):
                self._shape = shape  # the log's shape: tried first on its next block
                break
        del plain
        tails = [tail for tail in counts if tail]  # the driver's messages, in the order each first appears
        if any(tail.startswith(_INIT_TAILS) for tail in tails):
            return False  # a driver load, or the probe message
        forms = _HEX_BLOCK_RE.sub("0x_", "\n".join(tails)).split("\n") if tails else []
        form_of = dict(zip(tails, forms, strict=True))
        groups: dict[str, list] = {}  # form -> [lines, its first message, messages]
        for tail, form in form_of.items():
            g = groups.get(form)
            if g is None:
                groups[form] = [counts[tail], tail, 1]
            else:
                g[0] += counts[tail]
                g[2] += 1
        judged = []
        no_cache = _NoCache()
        for form, (times, tail, messages) in groups.items():
            hit = self._classify(tail, no_cache)
            if hit is _NOTHING:
                continue
            if hit is _LOAD_MARK or hit[0] == "reset" or messages > 1 and hit[1][1] == 154:
                return False
            judged.append((form, times, tail, hit[1], hit[2], messages > 1))
        self.lines += len(items)
        n = self.lines  # every fault here is after the last (re)initialisation and before the next
        events = self.events
        firsts: dict[int, tuple] = {}  # line of the block -> the event it starts
        for _form, times, tail, key, detail, differ in judged:
            ev = events.get(key)
            if ev is None:
                ev = events[key] = [key[0], key[1], detail, key[2], "", "", 0, n, False]
                firsts[items.index(tail)] = key
            ev[COUNT] += times
            if differ or detail != ev[DETAIL]:
                ev[VARIES] = True
        # Each fault's latest line: walk back from the end until every fault here is met (in a
        # storm, within a few lines; never more than the block).
        key_of = {form: key for form, _, _, key, _, _ in judged}
        unmet = set(key_of.values())
        lasts: dict[int, tuple] = {}
        for i in range(len(items) - 1, -1, -1):
            key = key_of.get(form_of.get(items[i], ""))
            if key in unmet:
                unmet.discard(key)
                lasts[len(items) - 1 - i] = key
                if not unmet:
                    break
        for at, key in _heads(text, firsts, backwards=False):
            events[key][FIRST] = events[key][LAST] = at
        for at, key in _heads(text, lasts, backwards=True):
            ev = events[key]
            ev[LAST], ev[LAST_N] = at, n
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
            if line[:1] in _INDENT:
                # A record's later line: the driver's own only as the probe message's next lines,
                # and only under a record that began with `NVRM:` (a user's path in exec's warning
                # may hold a newline: /dev/kmsg escapes it, dmesg and journalctl indent what follows).
                if i < 0 or not (self.probe_left and self._in_driver) or line[:i].strip():
                    continue
            else:
                if i > 0 and not starts_message(line, i):
                    i = -1  # a user's words quoted by the kernel: not the driver's
                self._in_driver = i >= 0
            if i < 0:
                if "Linux version " in line:
                    m = _BOOT_RE.search(line)
                    if m and starts_message(line, m.start()):
                        self.init_all, self.last_init = n, line.strip()
                elif _RESET in line:
                    m = _RESET_RE.search(line)
                    if m and starts_message(line, m.start(), _USER_PREFIX_RE):
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


def _heads(text: str, wanted: dict[int, tuple], backwards: bool) -> Iterator[tuple[str, tuple]]:
    """(what comes before `NVRM:`, WANTED's value) for the lines of TEXT whose numbers (0 the first
    line, or the last one BACKWARDS) WANTED names: a walk from that end of the block that stops at
    the farthest one wanted (in a storm, a few lines from either end)."""
    left = len(wanted)
    for k, (start, stop) in enumerate(_line_spans(text, backwards)):
        if not left:
            return
        key = wanted.get(k)
        if key is not None:
            left -= 1
            yield text[start:text.index("NVRM:", start, stop)], key


def _line_spans(text: str, backwards: bool) -> Iterator[tuple[int, int]]:
    """(start, end) of each line of TEXT, from its first line on, or from its last line back."""
    if backwards:
        end = len(text)
        while end >= 0:
            start = text.rfind("\n", 0, end) + 1
            yield start, end
            end = start - 1
    else:
        start = 0
        while start >= 0:
            end = text.find("\n", start)
            yield start, len(text) if end < 0 else end
            start = end + 1 if end >= 0 else -1


def _init_spans(text: str) -> list[tuple[int, int]]:
    """Where in TEXT a GPU may start afresh, as (first, end) of whole lines, in order and merged:
    every line holding a boot's, a driver load's, a reset's or the probe message's words (whether
    they begin the message is for _feed_each to say). A few in a log; found at C speed."""
    spans: list[tuple[int, int]] = []
    for word in _INIT_WORDS:
        at = text.find(word)
        while at >= 0:
            first = text.rfind("\n", 0, at) + 1
            end = text.find("\n", at)
            end = len(text) if end < 0 else end
            spans.append((first, end))
            at = text.find(word, end)
    if len(spans) < 2:
        return spans
    spans.sort()
    merged = [spans[0]]
    for first, end in spans[1:]:
        if first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((first, end))
    return merged


class _NoCache(dict):
    """_classify's cache for the block path: forms are judged once a block, never remembered (a
    storm's raw messages, each with its own pid, would only churn the line path's cache)."""

    def __setitem__(self, key: str, value: tuple) -> None:
        pass


def _fold_key(pci: str, xid: int | None, detail: str, gi: int | None) -> tuple:
    # Xid 154's message is the new recovery action (`to 0x2`), which decides the step: never folded.
    return (pci, xid, gi, detail if xid == 154 else _HEX_RE.sub("0x_", detail))
