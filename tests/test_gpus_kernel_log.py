"""Reading the kernel log: once, streamed, in memory that does not grow with the log, and a
second read that parses only what is new (reconcilers/gpus/kernel_log.py, fold.py).

Sources: a file (RECONCILE_KERNEL_LOG), /dev/kmsg (a file in its format through RECONCILE_KMSG,
and the real one read-only where this process may), `journalctl -k -b 0` (the real journal where
it holds kernel messages; a `journalctl` on PATH where the source must be told apart)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reconcile_host.reconcilers.gpus import health
from reconcile_host.reconcilers.gpus.fold import LogFold, parse_kernel_log
from reconcile_host.reconcilers.gpus.kernel_log import JOURNAL, KMSG, read_kernel_log, record_path
from reconcile_host.reconcilers.gpus.observed import Gpu

BOOT = "[    0.000000] Linux version 6.1.0\n"
XID79 = "[ 4254.1] NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.\n"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A state directory of the test's own, no RECONCILE_KERNEL_LOG, a boot id file of its own."""
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("RECONCILE_KERNEL_LOG", raising=False)
    monkeypatch.delenv("RECONCILE_KMSG", raising=False)
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    monkeypatch.setenv("RECONCILE_BOOT_ID_FILE", str(boot))
    return tmp_path


def storm(n: int, unique_every: int = 7) -> str:
    """N lines of a sick node's log: 29 distinct faults (Xid number, GPU, verdict) from a few
    processes, every UNIQUE_EVERY-th MMU fault at an address of its own, ESR registers varying,
    between other kernel lines."""
    out = []
    for i in range(n):
        k = i % 29
        pci = f"0000:{0x18 + k % 8:02x}:00"
        at = f"[{1000 + i * 0.001:12.6f}]"
        if i % 5 == 4:
            out.append(f"{at} mlx5_core 0000:c1:00.0: poll_health:{i}: port {k % 2} ok")
        elif k < 8:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 95, pid={4000 + i % 3}, name=python3, Uncontained: "
                       "LTC TAG (0x2, 0x1). RST: Yes, D-RST: No")
        elif k < 16:
            addr = f"0x{(i if i % unique_every == 0 else k) * 4096:012x}"
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 31, pid={5000 + i % 4}, name=pt_main_thread, "
                       f"Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ {addr}. "
                       "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE")
        elif k < 24:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 13, pid='<unknown>', name=<unknown>, "
                       f"Graphics Exception: ESR 0x546fb0=0x{i % 97:x} 0x546fb4=0x24")
        else:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from "
                       f"0x0 (None) to 0x{1 + k % 2} ({'GPU Reset' if k % 2 == 0 else 'Node Reboot'} Required)")
    return "\n".join(out) + "\n"


def realistic_storm(n: int) -> list[str]:
    """N lines of a real storm: every line from a process of its own (a fresh pid=, a few names),
    one MMU fault in 10 at an address of its own, ESR registers varying, 29 distinct faults on 8
    GPUs; a driver reload, a GPU reset, the probe message over three lines and a user's quoted
    Xid among them."""
    names = ("pt_main_thread", "python3", "nvidia-smi", "torchrun")
    out = ["[    0.000000] Linux version 6.8.0-1015-nvidia (buildd@lcy02) #16-Ubuntu SMP",
           "[   21.402138] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01"]
    for i in range(n):
        k = i % 29
        pci = f"0000:{(0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)[k % 8]:02x}:00"
        at = f"[{2000 + i * 0.004:12.6f}]"
        pid = f"pid={100000 + i}, name={names[i % 4]}"
        if i == n // 3:
            out.append(f"{at} NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01")
        elif i == n // 2:
            out.append(f"{at} GPU 00000000:2A:00.0 was successfully reset.")
        elif i == 2 * n // 3:
            out.append(f"{at} NVRM: The NVIDIA GPU 0000:5d:00.0")
            out.append(" " * 15 + "NVRM: (PCI ID: 10de:2330) installed in this system has")
            out.append(" " * 15 + "NVRM: fallen off the bus and is not responding to commands.")
        elif i % 10 == 9:
            out.append(f"{at} mlx5_core 0000:c1:00.0: poll_health:{i // 10}: ok")
        elif i % 1000 == 7:
            out.append(f"{at} process 'x' launched '/tmp/NVRM: Xid (PCI:{pci}): 79, {pid}, GPU has fallen off the "
                       "bus.' with NULL argv: empty string added")
        elif k < 8:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 95, {pid}, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No")
        elif k < 14:
            addr = i * 0x1000 if i % 10 == 0 else 0x7f3a_1c00_0000 + k * 0x1000
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 31, {pid}, Ch 00000008, intr 00000000. MMU Fault: ENGINE "
                       f"GRAPHICS GPCCLIENT_T1_8 faulted @ 0x{addr >> 32:x}_{addr & 0xffffffff:08x}. Fault is of "
                       "type FAULT_PDE ACCESS_TYPE_VIRT_WRITE")
        elif k < 19:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 13, pid='<unknown>', name=<unknown>, Graphics Exception: "
                       f"ESR 0x546fb0=0x{0x11f000e + i % 13:x} 0x546fb4=0x24")
        elif k < 22:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to "
                       f"0x{1 + k % 2} ({'GPU Reset' if k % 2 == 0 else 'Node Reboot'} Required)")
        elif k < 25:
            out.append(f"{at} NVRM: Xid (PCI:{pci} GPU-I:0{k % 3}): 119, {pid}, Timeout after 6s of waiting for "
                       f"RPC response from GPU{k % 8} GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).")
        else:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 43, {pid}, Ch 0000{k:04x}")
    return out


@pytest.mark.parametrize("block_lines", [1_000, 30_000, 10**9])
def test_a_realistic_storm_by_blocks_equals_the_fold_a_line_at_a_time(block_lines):
    """The block path normalises what varies per line (pid=, name=, addresses) over the block at C
    speed: the events, counts, first and last times, `varies` and verdicts are the line path's."""
    lines = realistic_storm(60_000)
    by_line = LogFold()
    by_line._feed_each(lines)
    by_block = LogFold()
    for at in range(0, len(lines), block_lines):
        by_block.feed(text="\n".join(lines[at:at + block_lines]))
    state_line, state_block = by_line.state(), by_block.state()
    for state in (state_line, state_block):
        state["events"] = [ev[:7] + ev[8:] for ev in state["events"]]  # LAST_N: the block's end
    assert state_block == state_line
    assert by_block.kernel_events() == by_line.kernel_events()
    events = by_line.kernel_events()
    assert len(events) == 29 + 1  # and the probe's GPU fallen off the bus
    assert any(e.varies for e in events if e.xid == 31) and not any(e.xid == 79 for e in events)
    assert sum(e.count for e in events if e.xid is not None) == \
        sum(" NVRM: Xid" in x and "launched" not in x for x in lines)


def distinct(events) -> set:
    return {(e.pci, e.xid, e.action) for e in events}


def test_repeats_fold_into_one_event_per_distinct_fault():
    text = storm(20_000)
    events, _ = parse_kernel_log(text)
    # The faults the generator wrote, read back from its lines with the fold's own parser one at a time.
    lines = [x for x in text.splitlines() if "NVRM" in x]
    one_by_one = {(e.pci, e.xid, e.action) for x in lines[:29 * 6] for e in parse_kernel_log(x)[0]}
    assert len(events) == len(distinct(events)) == len(one_by_one)
    assert sum(e.count for e in events) == len(lines)
    mmu = [e for e in events if e.xid == 31]
    assert mmu and all(e.varies and "faulted @ 0x" in e.detail for e in mmu)
    assert "addresses vary" in mmu[0].describe()
    # Xid 154 to 0x1 and to 0x2 differ in their step: never folded into one.
    assert {e.action for e in events if e.xid == 154} == {"RESET_GPU", "RESTART_BM"}


@pytest.mark.parametrize("block_lines", [7, 500, 20_000])
def test_a_storm_folded_by_blocks_equals_the_fold_a_line_at_a_time(block_lines):
    # The block path counts each distinct message at C speed and looks up only its first and last
    # line; the line path walks every line. Same events, counts, first and last times, `varies`.
    lines = storm(20_000).splitlines()
    by_line = LogFold()
    by_line._feed_each(lines)
    by_block = LogFold()
    for at in range(0, len(lines), block_lines):
        by_block.feed(text="\n".join(lines[at:at + block_lines]))
    # LAST_N (the line number of an event's latest line) is the block's end on the block path: no
    # (re)initialisation falls inside a counted block, so whether a fault is current is the same.
    def without_line_numbers(fold):
        state = fold.state()
        state["events"] = [ev[:7] + ev[8:] for ev in state["events"]]
        return state

    assert without_line_numbers(by_block) == without_line_numbers(by_line)
    assert by_block.kernel_events() == by_line.kernel_events()
    assert sum(ev[6] for ev in by_block.state()["events"]) == sum("NVRM: Xid" in x for x in lines)


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return next(int(x.split()[1]) for x in fh if x.startswith("rchar:"))


def test_a_second_read_of_a_file_reads_only_what_was_appended(env, monkeypatch):
    log = env / "kern.log"
    log.write_text(BOOT + storm(200_000))
    monkeypatch.setenv("RECONCILE_KERNEL_LOG", str(log))
    before = _rchar()
    fold, first = read_kernel_log()
    assert _rchar() - before >= log.stat().st_size
    assert not first.resumed and first.lines_read == 200_001
    with log.open("a") as fh:
        fh.write(XID79 + "[ 4254.2] NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.\n")
    size = log.stat().st_size
    before = _rchar()
    fold, second = read_kernel_log()
    assert _rchar() - before < 64 * 1024 < size // 100  # the record and the new tail, not the file
    assert second.resumed and second.lines_read == 2
    # What the two reads folded is what one read of the whole file folds.
    whole, last = parse_kernel_log(log.read_text())
    assert fold.kernel_events() == whole and fold.last_init == last
    (xid79,) = [e for e in whole if e.xid == 79]
    assert xid79.count == 2 and xid79.first == "[ 4254.1]" and xid79.last == "[ 4254.2]"


def test_a_rewritten_file_is_read_afresh(env, monkeypatch):
    log = env / "kern.log"
    log.write_text(BOOT + XID79 * 3)
    monkeypatch.setenv("RECONCILE_KERNEL_LOG", str(log))
    read_kernel_log()
    log.write_text(BOOT + XID79.replace("79,", "48,") * 4)  # same inode, longer, other bytes
    fold, again = read_kernel_log()
    assert not again.resumed and again.lines_read == 5
    assert [(e.xid, e.count) for e in fold.kernel_events()] == [(48, 4)]


def _rss_of_a_read(path: Path, state: Path) -> int:
    # VmHWM, the peak of this process's own memory (getrusage's ru_maxrss keeps the parent's across exec).
    code = ("from reconcile_host.reconcilers.gpus.kernel_log import read_kernel_log; "
            "f, log = read_kernel_log(); assert log.lines_read > 0; "
            "hwm = next(x for x in open('/proc/self/status') if x.startswith('VmHWM:')).split()[1]; "
            "print(hwm, len(f.events))")
    env = {**os.environ, "RECONCILE_KERNEL_LOG": str(path), "RECONCILE_STATE_DIR": str(state)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    rss_kib, events = out.stdout.split()
    return int(rss_kib) * 1024, int(events)


def test_memory_does_not_grow_with_the_log(env):
    # Both logs far longer than the block the fold counts at a time (kernel_log.CHUNK, 1 MiB).
    small, big = env / "small.log", env / "big.log"
    small.write_text(BOOT + storm(150_000))
    big.write_text(BOOT + storm(450_000))
    rss_small, ev_small = _rss_of_a_read(small, env / "s1")
    rss_big, ev_big = _rss_of_a_read(big, env / "s2")
    grown = big.stat().st_size - small.stat().st_size
    assert grown > 20 * 2**20
    assert ev_small == ev_big  # the report is bounded by distinct faults, not lines
    # Against 20+ MiB more log: a fold that kept lines would grow by at least that much; the
    # allocator's own slack over a few blocks is a few MiB either way.
    assert rss_big - rss_small < grown / 4, (rss_small, rss_big, grown)
    assert json.loads((env / "s2" / "gpus-kernel-log.json").read_text())["fold"]["lines"] == 450_001


# --- /dev/kmsg: the format, sequence numbers, wraps ---

def kmsg(records: list[tuple[int, str]]) -> str:
    return "".join(f"6,{seq},{seq * 1000 + 5},-;{msg}\n SUBSYSTEM=pci\n" for seq, msg in records)


def test_kmsg_from_boot_is_read_once_then_only_new_records(env, monkeypatch):
    ring = env / "kmsg"
    recs = [(0, "Linux version 6.1.0"), (1, "usb 1-1: new device"),
            (2, "NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.")]
    ring.write_text(kmsg(recs))
    monkeypatch.setenv("RECONCILE_KMSG", str(ring))
    fold, log = read_kernel_log()
    assert (log.source, log.complete, log.lines_read, log.resumed) == (KMSG, True, 3, False)
    (ev,) = fold.kernel_events()
    assert ev.xid == 79 and ev.first == "[    0.002005]"
    recs += [(3, "NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.")]
    ring.write_text(kmsg(recs))
    fold, log = read_kernel_log()
    assert log.resumed and log.lines_read == 1 and [e.count for e in fold.kernel_events()] == [2]
    # Another boot starts afresh.
    (env / "boot_id").write_text("boot-2\n")
    fold, log = read_kernel_log()
    assert not log.resumed and log.lines_read == 4


def test_a_resume_with_nothing_new_leaves_the_record_as_it_was(env, monkeypatch):
    """A watch pass on a quiet machine: the ring buffer has nothing after the record's number, so the
    record (the same fold, the same number) is not written again; a new record is."""
    ring = env / "kmsg"
    recs = [(0, "Linux version 6.1.0"), (1, "usb 1-1: new device")]
    ring.write_text(kmsg(recs))
    monkeypatch.setenv("RECONCILE_KMSG", str(ring))
    read_kernel_log()
    record = Path(record_path())
    written = record.stat()
    _, log = read_kernel_log()
    assert log.resumed and log.lines_read == 0
    assert (record.stat().st_ino, record.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    ring.write_text(kmsg([*recs, (2, "NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.")]))
    fold, log = read_kernel_log()
    assert log.resumed and log.lines_read == 1 and [e.xid for e in fold.kernel_events()] == [79]
    assert record.stat().st_ino != written.st_ino and json.loads(record.read_text())["position"]["seq"] == 2


def test_a_wrapped_ring_buffer_goes_to_the_journal(env, monkeypatch):
    ring = env / "kmsg"
    ring.write_text(kmsg([(500, "usb 1-1: new device")]))
    monkeypatch.setenv("RECONCILE_KMSG", str(ring))
    bindir = env / "bin"
    bindir.mkdir()
    said = BOOT.replace("Linux", "host kernel: Linux") + XID79
    (bindir / "journalctl").write_text(f"#!/bin/sh\nprintf '%s' '{said}'\n")
    (bindir / "journalctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    fold, log = read_kernel_log()
    assert log.source == JOURNAL and log.complete and [e.xid for e in fold.kernel_events()] == [79]
    # Neither reaches back to boot: incomplete, and what the journal could not do is said.
    (bindir / "journalctl").write_text("#!/bin/sh\necho 'No journal files were found.' >&2; exit 1\n")
    fold, log = read_kernel_log()
    assert log.source == KMSG and not log.complete and "rotated" in log.note and "exited 1" in log.note
    monkeypatch.setenv("PATH", str(env / "no-bin"))
    monkeypatch.setenv("RECONCILE_KMSG", str(env / "absent"))
    _, log = read_kernel_log()
    assert not log.readable and "No such file" in log.note and "journalctl is not installed" in log.note


def test_the_journal_goes_on_from_its_cursor_without_its_entry_again(env, monkeypatch):
    """journalctl --cursor=C prints C's own entry first (already folded: left out, with the lines
    that continue it); an output that does not begin with it lost entries, and says so."""
    ring = env / "kmsg"
    ring.write_text(kmsg([(500, "usb 1-1: new device")]))  # wrapped: the journal is read
    monkeypatch.setenv("RECONCILE_KMSG", str(ring))
    bindir = env / "bin"
    bindir.mkdir()
    out = {"": "[    0.000000] h kernel: Linux version 6.1.0\n"
               "[  100.000000] h kernel: NVRM: Xid (PCI:0000:5d:00): 13, pid=1, name=x, Graphics Exception\n"
               "                 h kernel: its second line\n-- cursor: c1\n",
           "c1": "[  100.000000] h kernel: NVRM: Xid (PCI:0000:5d:00): 13, pid=1, name=x, Graphics Exception\n"
                 "                 h kernel: its second line\n"
                 "[  200.000000] h kernel: NVRM: Xid (PCI:0000:5d:00): 13, pid=2, name=y, Graphics Exception\n"
                 "[  201.000000] h kernel: usb 1-1: gone\n-- cursor: c2\n",
           "c2": "[  300.000000] h kernel: NVRM: Xid (PCI:0000:5d:00): 79, pid=3, name=z, GPU has fallen off "
                 "the bus.\n-- cursor: c3\n"}
    for cursor, text in out.items():
        (bindir / f"out{cursor}").write_text(text)
    (bindir / "journalctl").write_text(
        "#!/bin/sh\nc=\nfor a; do case $a in --cursor=*) c=${a#--cursor=};; esac; done\n"
        f"cat '{bindir}/out'$c\n")
    (bindir / "journalctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    fold, log = read_kernel_log()
    assert log.source == JOURNAL and log.complete and not log.resumed and log.lines_read == 4
    assert [(e.xid, e.count) for e in fold.kernel_events()] == [(13, 1)]
    rec = json.loads(Path(record_path()).read_text())
    assert rec["position"] == {"cursor": "c1", "entry": out["c1"].split("\n")[0]}
    fold, log = read_kernel_log()  # from c1: its entry and that entry's second line left out
    assert log.resumed and log.lines_read == 3 and not log.lost
    assert [(e.xid, e.count) for e in fold.kernel_events()] == [(13, 2)]
    assert json.loads(Path(record_path()).read_text())["position"]["entry"].startswith("[  201.000000]")
    fold, log = read_kernel_log()  # from c2: the output does not begin with c2's entry
    assert [(e.xid, e.count) for e in fold.kernel_events()] == [(13, 2), (79, 1)]
    assert log.lost.startswith("the journal no longer holds the entries between [  201") and "[  300" in log.lost


def test_records_lost_to_a_wrap_are_said_until_the_driver_reloads(env, monkeypatch):
    ring = env / "kmsg"
    monkeypatch.setenv("RECONCILE_KMSG", str(ring))
    monkeypatch.setenv("PATH", str(env / "no-bin"))  # no journal to stand in
    ring.write_text(kmsg([(0, "Linux version 6.1.0"), (1, "usb 1-1: new device")]))
    read_kernel_log()
    ring.write_text(kmsg([(9, "usb 1-1: gone"), (10, "NVRM: Xid (PCI:0000:5d:00): 13, Graphics Exception")]))
    fold, log = read_kernel_log()
    assert log.lost.startswith("ring-buffer records 2..8 were overwritten before they were read"), log.lost
    gpu = Gpu(0, "H100", "GPU-0", "00000000:5D:00.0", 1, 0)
    judged = health.judge(gpu, fold.kernel_events(), log)
    assert judged.health == "unknown" and "lines lost before they were read" in judged.problems[0]
    # Said again on the next read, not forgotten...
    ring.write_text(kmsg([(10, "x"), (11, "usb 1-1: new device")]))
    assert read_kernel_log()[1].lost
    # ...until a driver load makes the lost lines history.
    ring.write_text(kmsg([(11, "x"), (12, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01")]))
    fold, log = read_kernel_log()
    assert log.lost == "" and health.judge(gpu, fold.kernel_events(), log).health == "healthy"


def _real_kmsg() -> list[tuple[int, int]]:
    """(sequence number, lines) of each record the real /dev/kmsg holds now, read here."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                rec = os.read(fd, 65536).split(b"\n", 1)[0]
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
            header, _, text = rec.partition(b";")
            out.append((int(header.split(b",")[1]), 1 + text.count(b"\\x0a")))
    finally:
        os.close(fd)
    return out


def test_the_real_kmsg_second_read_parses_only_new_records(env):
    try:
        before = _real_kmsg()
    except PermissionError:
        pytest.skip("/dev/kmsg is not readable here (kernel.dmesg_restrict)")
    if not before or before[0][0] != 0:
        pytest.skip("this machine's ring buffer no longer starts at boot")
    fold, first = read_kernel_log()
    assert first.source == KMSG and first.complete
    assert first.lines_read >= sum(n for _, n in before)
    seq = json.loads(Path(record_path()).read_text())["position"]["seq"]
    assert seq >= before[-1][0]
    _, second = read_kernel_log()
    after = _real_kmsg()
    assert second.resumed and second.lines_read <= sum(n for s, n in after if s > seq)


def test_the_real_journal_second_read_starts_at_the_cursor(env):
    probe = subprocess.run(["journalctl", "-k", "-b", "0", "-n", "1", "-q", "--no-pager"], capture_output=True,
                           text=True)
    if probe.returncode != 0 or not probe.stdout.strip():
        # [ci-ok]: the CI machine and this one run no journald (no systemd as PID 1), and the
        # namespaced systemd of the tests masks it; the cursor logic is covered on kmsg and files.
        pytest.skip("no journal with this boot's kernel messages here (journald does not run) [ci-ok]")
    os.environ["RECONCILE_KMSG"] = "/nonexistent"  # the journal, not the ring buffer
    try:
        fold, first = read_kernel_log()
        assert first.source == JOURNAL and first.lines_read > 0
        rec = json.loads(Path(record_path()).read_text())
        assert rec["position"]["cursor"]
        _, second = read_kernel_log()
        after = f"--after-cursor={rec['position']['cursor']}"
        new = subprocess.run(["journalctl", "-k", "-b", "0", "-q", "--no-pager", after], capture_output=True,
                             text=True).stdout.splitlines()
        assert second.resumed and second.lines_read <= len(new) + 1 and not second.lost
    finally:
        del os.environ["RECONCILE_KMSG"]
