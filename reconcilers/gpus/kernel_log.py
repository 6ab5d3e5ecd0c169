"""Reading this boot's kernel log once, streamed, and only what is new since the last read.

The Xid history that matters starts at boot. Where it is read from, in this order, deciding
before reading more than one line of either:
- `/dev/kmsg` (the kernel's ring buffer, what `dmesg` reads; root where kernel.dmesg_restrict=1),
  when its first record is the boot's first (sequence number 0) or the record of the last read
  still follows on (its sequence number is in the buffer);
- else `journalctl -k -b 0` (the journal's copy of this boot's kernel messages): the ring buffer
  is small (often 1 MiB) and a long uptime or an Xid storm wraps it;
- else the ring buffer as it is, incomplete: the GPUs' health is `unknown`, never `healthy`, as
  when neither can be read (a critical Xid may be in the part that could not be read).

Nothing is held whole: lines stream through fold.LogFold, which keeps each distinct fault once.
What the fold learnt is kept in a record (RECORD in the state directory, written atomically)
with where the read stopped: /dev/kmsg's sequence number (the kernel numbers every record,
Documentation/ABI/testing/dev-kmsg), journald's cursor (`--show-cursor`, then `--cursor`), or a
file's identity and offset. The next read (a second `diff`, every `watch` pass) parses only what
came after (the ring buffer's older records are skipped by number, unparsed: /dev/kmsg cannot
seek to one). Another boot (boot_id), another source, or a file that is not the one read (inode,
a shorter size, other bytes before the offset) starts afresh.

Lines lost before they were read are said, never guessed: when the ring buffer wrapped past the
record's sequence number and the journal cannot stand in, or the journal no longer holds the
cursor's entry (vacuumed, rotated away), the read goes on and `KernelLog.lost` says between which
lines; the GPUs' health is `unknown` until the next boot or driver load makes those lines history.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ...core.atomic import write_json
from ...core.boot import boot_id as _boot_id
from ...core.paths import state_dir
from .fold import LogFold
from .observed import KernelLog
from .xid import KERNEL_LOG_ENV

if TYPE_CHECKING:
    from ...core.host import Host

KMSG_ENV = "RECONCILE_KMSG"  # a file in /dev/kmsg's format instead of /dev/kmsg: the tests' seam
KMSG = "/dev/kmsg"
JOURNAL_TIMEOUT = 60.0
JOURNAL_ARGV = ["journalctl", "-k", "-b", "0", "-o", "short-monotonic", "--no-pager", "-q", "--show-cursor"]
JOURNAL = " ".join(JOURNAL_ARGV[:4])
RECORD = "gpus-kernel-log.json"
RECORD_FORMAT = 1
CHUNK = 1 << 20  # bytes decoded and folded at a time: a storm's lines are counted a block at a time
KMSG_READ = 8192  # CONSOLE_EXT_LOG_MAX: the longest record /dev/kmsg gives
BATCH = 4096  # ring-buffer records folded at a time
FINGERPRINT = 4096  # bytes at each end of what a file's record covers, hashed
_STAMP_RE = re.compile(r"\[\s*(\d+)\.\d+\]")
_KMSG_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")


def starts_at_boot(lines: list[str]) -> tuple[bool, str]:
    """(whether LINES begin with this boot, the first timestamp seen)."""
    first = ""
    for line in lines[:50]:
        if "Linux version " in line:
            return True, first
        m = _STAMP_RE.search(line)
        if m and not first:
            first = m.group(0)
            if int(m.group(1)) == 0:
                return True, first
    return False, first


def record_path() -> str:
    return os.path.join(state_dir(), RECORD)


def _load_record(source: str, boot: str, check_boot: bool = True) -> dict[str, Any] | None:
    """The last read's record when it was of SOURCE in this boot, else None (start afresh)."""
    try:
        with open(record_path(), encoding="utf-8") as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT or rec.get("source") != source:
        return None
    if check_boot and (not boot or rec.get("boot_id") != boot):
        return None
    return rec


def _save_record(source: str, boot: str, fold: LogFold, log: KernelLog, position: dict[str, Any]) -> None:
    try:
        write_json(record_path(), {"format": RECORD_FORMAT, "source": source, "boot_id": boot,
                                   "complete": log.complete, "note": log.note, "position": position,
                                   "fold": fold.state()})
    except OSError:
        pass  # no record: the next read starts afresh, which is slower, never wrong


def read_kernel_log(host: Host | None = None) -> tuple[LogFold, KernelLog]:
    """This boot's kernel log folded (fold.LogFold) and where it came from. HOST is unused: the
    gpus kind describes the machine reconcile runs on, and a command's whole output is what
    streaming avoids holding."""
    boot = boot_id()
    path = os.environ.get(KERNEL_LOG_ENV)
    if path:  # a test/diagnostic knob: the file is taken as the whole log
        fold, log = _read_file(path, boot)
    else:
        fold, log = _read_machine(boot)
    lost = fold.lost_since_init()
    return fold, KernelLog(log.source, log.readable, log.complete, log.note, fold.last_init, lost,
                           log.lines_read, log.resumed)


# --- a file (RECONCILE_KERNEL_LOG) ---

def _fingerprint(fh: Any, offset: int) -> str:
    """What the bytes a record covers looked like: the first and last FINGERPRINT bytes before OFFSET."""
    import hashlib  # here, not at the top: a file log is a test's knob; diff's start-up skips _hashlib

    h = hashlib.sha256()
    fh.seek(0)
    h.update(fh.read(min(offset, FINGERPRINT)))
    fh.seek(max(0, offset - FINGERPRINT))
    h.update(fh.read(min(offset, FINGERPRINT)))
    return h.hexdigest()


def _line_blocks(readinto: Callable[[memoryview], int | None]) -> Iterator[memoryview]:
    """What READINTO fills, a block of whole lines at a time (no last newline), as a view of one
    buffer which the next block overwrites (used before asking for the next); the very last line
    may lack its newline. Memory: one buffer of CHUNK bytes (more only for a longer line),
    whatever the log's size; the bytes are copied once, by the read."""
    buf = bytearray(CHUNK)
    have = 0
    while True:
        if have == len(buf):
            buf.extend(bytes(len(buf)))  # a line longer than the buffer
        with memoryview(buf) as free:
            got = readinto(free[have:])
        if not got:
            break
        have += got
        cut = buf.rfind(b"\n", 0, have)
        if cut < 0:
            continue
        with memoryview(buf) as view, view[:cut] as block:
            yield block
        buf[:have - cut - 1] = buf[cut + 1:have]
        have -= cut + 1
    if have:
        with memoryview(buf) as view, view[:have] as block:
            yield block


def _texts_of(readinto: Callable[[memoryview], int | None]) -> Iterator[str]:
    """_line_blocks, decoded."""
    for block in _line_blocks(readinto):
        try:
            yield str(block, "ascii")  # a kernel log is ASCII almost always: the fast decoder
        except UnicodeDecodeError:
            yield str(block, "utf-8", "replace")


def _read_file(path: str, boot: str) -> tuple[LogFold, KernelLog]:
    source = f"file:{os.path.abspath(path)}"
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, after the record is written
    except OSError as exc:
        return LogFold(), KernelLog(path, readable=False, note=f"{path} unreadable: {exc.strerror}")
    with fh:
        st = os.fstat(fh.fileno())
        rec = _load_record(source, boot, check_boot=False)
        pos = rec["position"] if rec else {}
        offset = int(pos.get("offset", -1))
        same = (rec is not None and pos.get("dev") == st.st_dev and pos.get("ino") == st.st_ino
                and 0 <= offset <= st.st_size and pos.get("fingerprint") == _fingerprint(fh, offset))
        fold = LogFold(rec["fold"]) if same and rec else LogFold()
        fh.seek(offset if same else 0)
        before = fold.lines
        for text in _texts_of(fh.readinto):
            fold.feed(text=text)
        end = fh.tell()
        log = KernelLog(path, lines_read=fold.lines - before, resumed=same)
        _save_record(source, boot, fold, log, {"dev": st.st_dev, "ino": st.st_ino, "offset": end,
                                               "fingerprint": _fingerprint(fh, end)})
    return fold, log


# --- the machine: /dev/kmsg, else the journal ---

def _kmsg_records(fd: int) -> Iterator[tuple[int, int, bytes]]:
    """(sequence number, microseconds since boot, the message) of each record from FD on, until the
    ring buffer has no more. A record overwritten while being read (EPIPE) shows as a jump in numbers.
    /dev/kmsg gives one record a read, of at most CONSOLE_EXT_LOG_MAX (8 KiB) bytes: util-linux's
    dmesg reads it with BUFSIZ (8 KiB), not a file's chunk (a read's buffer is allocated whole)."""
    size = KMSG_READ if stat.S_ISCHR(os.fstat(fd).st_mode) else CHUNK

    def readinto(view: memoryview) -> int:
        nonlocal size
        while True:
            try:  # /dev/kmsg: one record a read; a regular file: many
                with view[:size] as into:
                    return os.readv(fd, [into])
            except BlockingIOError:
                return 0  # the ring buffer has no more
            except OSError as exc:
                if exc.errno == errno.EINVAL and size < CHUNK:
                    size = CHUNK  # a record longer than the kernel's own limit: read it whole
                elif exc.errno != errno.EPIPE:
                    raise

    for block in _line_blocks(readinto):
        for raw in bytes(block).split(b"\n"):
            if not raw or raw[:1] == b" ":
                continue  # a record's dictionary (" SUBSYSTEM=pci"): not the message
            header, _, text = raw.partition(b";")
            fields = header.split(b",")
            try:
                seq, usec = int(fields[1]), int(fields[2])
            except (IndexError, ValueError):
                continue
            yield seq, usec, text


def _kmsg_line(usec: int, text: bytes) -> str:
    """A record's message as dmesg prints it."""
    line = f"[{usec // 1000000:5d}.{usec % 1000000:06d}] " + text.decode("utf-8", "replace")
    # The kernel escapes newlines and other bytes in a message (\\xNN). Only the driver's own
    # records are unescaped into their lines: any other record stays one line, so a newline a user
    # put in text the kernel quotes (exec's filename) never starts a line that looks like a record.
    if "\\x" in line and text.startswith(b"NVRM:"):
        line = _KMSG_ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), line).replace("\n", "\n" + " " * 15)
    return line


def _fold_kmsg(fold: LogFold, records: Iterator[tuple[int, int, bytes]], after: int) -> int:
    """Fold the RECORDS numbered above AFTER (-1: all); a jump in numbers is lines lost. The last
    number read (AFTER when none)."""
    batch: list[str] = []
    last = after
    for seq, usec, text in records:
        if seq <= after:
            continue  # read by the last read: skipped unparsed
        if last >= 0 and seq != last + 1:
            fold.feed(batch)
            batch = []
            fold.gap(f"ring-buffer records {last + 1}..{seq - 1} were overwritten before they were read")
        line = _kmsg_line(usec, text)
        if "\n" in line:
            batch.extend(line.split("\n"))
        else:
            batch.append(line)
        last = seq
        if len(batch) >= BATCH:
            fold.feed(batch)
            batch = []
    fold.feed(batch)
    return last


def _chain(first: tuple[int, int, bytes] | None, rest: Iterator[tuple[int, int, bytes]]
           ) -> Iterator[tuple[int, int, bytes]]:
    if first is not None:
        yield first
    yield from rest


def _read_machine(boot: str) -> tuple[LogFold, KernelLog]:
    kmsg = os.environ.get(KMSG_ENV) or KMSG
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        fold, log, why = _read_journal(boot)
        if log is not None:
            return fold, log
        return fold, KernelLog("", readable=False, note=f"kernel log not readable: {kmsg}: {exc.strerror}; {why}")
    try:
        return _read_kmsg(fd, kmsg, boot)
    finally:
        os.close(fd)


def _read_kmsg(fd: int, kmsg: str, boot: str) -> tuple[LogFold, KernelLog]:
    """The ring buffer from its first record (the boot's, or the journal when it is not), or from
    where the last read stopped."""
    source = f"kmsg:{kmsg}"
    records = _kmsg_records(fd)
    first = next(records, None)  # decides the source before anything else is read
    rec = _load_record(source, boot)
    last_seq = int(rec["position"]["seq"]) if rec else -1
    at_boot = first is not None and first[0] == 0
    unchanged = False
    if rec is not None and (first is None or first[0] <= last_seq + 1):  # it follows on from the record
        fold = LogFold(rec["fold"])
        before = fold.lines
        last = _fold_kmsg(fold, _chain(first, records), last_seq)
        log = KernelLog(KMSG, complete=bool(rec.get("complete", True)), note=str(rec.get("note", "")),
                        lines_read=fold.lines - before, resumed=True)
        unchanged = last == last_seq  # nothing new (and so no gap): the record stands, unwritten
    elif at_boot:
        fold = LogFold()
        last = _fold_kmsg(fold, _chain(first, records), -1)
        log = KernelLog(KMSG, lines_read=fold.lines)
    else:
        start = _kmsg_line(first[1], first[2]).split("]")[0] + "]" if first else ""
        ring = ("the kernel ring buffer is empty" if first is None else
                f"the kernel ring buffer starts at {start}, not at boot (rotated)" if rec is None else
                f"the kernel ring buffer wrapped past the last read (record {last_seq}; it now starts at {first[0]})")
        jfold, jlog, why = _read_journal(boot)
        if jlog is not None and (jlog.complete or rec is None):
            return jfold, jlog
        why = why or jlog.note if jlog is not None else why
        if rec is not None:  # the journal cannot stand in: go on, and say what was lost
            fold = LogFold(rec["fold"])
            fold.gap(f"ring-buffer records {last_seq + 1}..{first[0] - 1 if first else '?'} were overwritten "
                     f"before they were read ({why})")
            complete, note = bool(rec.get("complete", True)), str(rec.get("note", ""))
        else:
            fold, complete, note = LogFold(), False, f"{ring}; {why}"
        before = fold.lines
        last = _fold_kmsg(fold, _chain(first, records), first[0] - 1 if first else -1)
        log = KernelLog(KMSG, complete=complete, note=note, lines_read=fold.lines - before, resumed=rec is not None)
    if last >= 0 and not unchanged:
        _save_record(source, boot, fold, log, {"seq": last})
    return fold, log


def _read_journal(boot: str) -> tuple[LogFold, KernelLog | None, str]:
    """`journalctl -k -b 0`, streamed; from the last read's cursor when there is one. The log
    is None when the journal could not be read, and the last item says why."""
    source = "journal"
    rec = _load_record(source, boot)
    cursor = rec["position"].get("cursor") if rec else None
    argv = [*JOURNAL_ARGV, f"--cursor={cursor}"] if cursor else JOURNAL_ARGV
    fold = LogFold(rec["fold"]) if cursor and rec else LogFold()
    before = fold.lines
    import tempfile  # here: the journal is read only when the ring buffer cannot tell (start-up cost)

    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
        except OSError as exc:
            return fold, None, "journalctl is not installed" if exc.errno == errno.ENOENT else \
                f"journalctl: {exc.strerror}"
        timer = threading.Timer(JOURNAL_TIMEOUT, proc.kill)
        timer.start()
        entry, cursor_out, first_lines, complete = "", "", True, True
        try:
            assert proc.stdout is not None
            for text in _texts_of(proc.stdout.readinto):
                if first_lines:
                    first_lines = False
                    head = text.split("\n", 50)[:50]
                    if cursor and rec:
                        if head[0] == rec["position"].get("entry"):
                            text = _after_entry(text)  # the cursor's own entry, folded by the last read
                            if not text:
                                continue
                        else:
                            fold.gap(f"the journal no longer holds the entries between {_stamp(rec)} and "
                                     f"{_stamp_of(head[0])} (rotated or vacuumed before they were read)")
                    else:
                        complete, _ = starts_at_boot(head)
                entry = _last_entry(text) or entry
                last = text[text.rfind("\n") + 1:]
                if last.startswith("-- cursor: "):
                    cursor_out = last[len("-- cursor: "):].strip()
                fold.feed(text=text)
            code = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        said = err.read().decode("utf-8", "replace").strip().splitlines()
    if code != 0:
        return LogFold(), None, (f"journalctl timed out after {JOURNAL_TIMEOUT:g}s" if code == -9 else
                                 f"`{JOURNAL}` exited {code}" + (f": {said[0]}" if said else ""))
    if first_lines and not cursor:
        return LogFold(), None, f"`{JOURNAL}` holds no kernel messages"
    if first_lines and cursor:  # not even the cursor's own entry
        fold.gap(f"the journal no longer holds the entry last read ({_stamp(rec or {})}) nor any after it")
    if cursor and rec:
        log = KernelLog(JOURNAL, complete=bool(rec.get("complete", True)), note=str(rec.get("note", "")),
                        lines_read=fold.lines - before, resumed=True)
    else:
        log = KernelLog(JOURNAL, complete=complete, lines_read=fold.lines - before,
                        note="" if complete else "the journal does not reach back to boot either")
    if cursor_out:
        _save_record(source, boot, fold, log, {"cursor": cursor_out, "entry": entry})
    return fold, log, ""


def _after_entry(text: str) -> str:
    """TEXT without its first line and the lines that continue it (indented)."""
    at = text.find("\n")
    while at >= 0 and text.startswith(" ", at + 1):
        at = text.find("\n", at + 1)
    return "" if at < 0 else text[at + 1:]


def _last_entry(text: str) -> str:
    """The last line of TEXT that begins an entry (journalctl's short-monotonic: `[time] …`)."""
    end = len(text)
    while end >= 0:
        start = text.rfind("\n", 0, end) + 1
        if text.startswith("[", start, end):
            return text[start:end]
        end = start - 1
    return ""


def _stamp_of(line: str) -> str:
    m = _STAMP_RE.search(line)
    return m.group(0) if m else "an entry with no time"


def _stamp(rec: dict[str, Any]) -> str:
    return _stamp_of(str((rec.get("position") or {}).get("entry", "")))


def boot_id() -> str:
    """This boot's id; "" where it cannot be read (core/boot.py)."""
    return _boot_id() or ""
