"""The kernel log's block path (fold.LogFold._feed_counted: `pid=`/`name=` left out over the whole
block, one item a line, one Counter) against the line path (LogFold._feed_each, a line at a
time, the reference): the same events, counts, first and last times, `varies` and verdicts on
every shape of log reconcile reads, on the lines a user can shape (the process name the driver
prints, at most 15 bytes: TASK_COMM_LEN), and a storm read without Python per line."""

from __future__ import annotations

import re

import pytest
from reconcile_host.reconcilers.gpus.fold import LogFold
from test_gpus_kernel_log import realistic_storm

# How the sources print a record's start (fold._PREFIX): dmesg and /dev/kmsg as reconcile renders
# it, journalctl -o short-monotonic, rsyslog's kern.log, dmesg -x, a syslog priority.
SHAPES = {
    "dmesg": "[{t}] ",
    "journal": "[{t}] gpu01 kernel: ",
    "kern.log": "Dec  4 12:00:00 gpu01 kernel: [{t}] ",
    "dmesg -x": "kern  :warn  : [{t}] ",
    "priority": "<4>[{t}] ",
}
_TIME = re.compile(r"^\[\s*([\d.]+)\] ")


def reshape(lines: list[str], shape: str) -> list[str]:
    return [_TIME.sub(lambda m: SHAPES[shape].format(t=m.group(1)), x) for x in lines]


def folds(lines: list[str], block_lines: int) -> tuple[LogFold, LogFold]:
    by_line = LogFold()
    by_line._feed_each(lines)
    by_block = LogFold()
    for at in range(0, len(lines), block_lines):
        by_block.feed(text="\n".join(lines[at:at + block_lines]))
    return by_line, by_block


def assert_same(by_line: LogFold, by_block: LogFold) -> None:
    # LAST_N (an event's latest line number) is the block's end on the block path: no
    # (re)initialisation falls inside a counted block, so whether a fault is current is the same.
    states = [by_line.state(), by_block.state()]
    for state in states:
        state["events"] = [ev[:7] + ev[8:] for ev in state["events"]]
    assert states[1] == states[0]
    assert by_block.kernel_events() == by_line.kernel_events()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block_lines", [700, 25_000])
def test_every_shape_of_log_folds_by_blocks_as_a_line_at_a_time(shape, block_lines):
    lines = reshape(realistic_storm(30_000), shape)
    by_line, by_block = folds(lines, block_lines)
    assert_same(by_line, by_block)
    assert len(by_line.kernel_events()) == 30  # 29 faults and the probe's GPU fallen off the bus


@pytest.mark.parametrize("shape", ["dmesg", "journal", "kern.log"])
def test_a_storm_is_counted_by_blocks_not_a_line_at_a_time(shape, monkeypatch):
    """Only the lines where a GPU starts afresh (the boot, the driver loads, the reset, the probe
    message and its two lines) are read one at a time; the storm's other lines never are."""
    lines = reshape(realistic_storm(60_000), shape)
    each: list[int] = []
    real = LogFold._feed_each

    def counting(self, some):
        some = list(some)
        each.append(len(some))
        real(self, some)

    monkeypatch.setattr(LogFold, "_feed_each", counting)
    by_block = LogFold()
    for at in range(0, len(lines), 7_000):
        by_block.feed(text="\n".join(lines[at:at + 7_000]))
    assert by_block.lines == len(lines)
    assert sum(each) <= 8, each
    assert sum(e.count for e in by_block.kernel_events()) > 50_000


def storm_of_names(names: list[str], n: int = 3_000) -> list[str]:
    """Xid lines whose process names are NAMES, among the driver's usual lines."""
    out = ["[    0.000000] Linux version 6.8.0", "[   21.402138] NVRM: loading NVIDIA UNIX x86_64 570.158.01"]
    for i in range(n):
        at = f"[{2000 + i * 0.004:12.6f}]"
        name = names[i % len(names)]
        k = i % 4
        pci = ("0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00")[k]
        if k == 0:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 95, pid={9000 + i}, name={name}, Uncontained: LTC TAG "
                       "(0x2, 0x1). RST: Yes, D-RST: No")
        elif k == 1:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 31, pid={9000 + i}, name={name}, Ch 00000008, intr 00000000. "
                       f"MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x7f3a_{i:08x}. Fault is of type "
                       "FAULT_PDE ACCESS_TYPE_VIRT_WRITE")
        elif k == 2:
            out.append(f"{at} NVRM: Xid (PCI:{pci} GPU-I:0{i % 3}): 119, pid={9000 + i}, name={name}, Timeout after "
                       f"6s of waiting for RPC response from GPU{i % 8} GSP! Expected function 103 (GSP_RM_ALLOC).")
        else:
            out.append(f"{at} NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
                       "(GPU Reset Required)")
    return out


# Process names a user can give (prctl PR_SET_NAME: 15 bytes), each shaped like the fields the
# block path leaves out or the words it looks for: another `pid=`/`name=`, an Xid number's `): N, `,
# the words of a reset or a boot, `NVRM:`, white space Python's str.isspace() knows beyond ASCII's.
NAMES = ["1, pid=, name=", "): 1, pid=,", "x): 1, pid=2,", "a,pid=1,name=b", "pid=, name=, a", ",pid=, name=, ",
         "): 12, pid=1,", "NVRM: Xid (PCI", "Linux version ", " was successful", "\x1cpid=\x1f", "\u00a0name=x,",
         "训练", "0x12,0x_", "'q, r'", "python3"]


@pytest.mark.parametrize("block_lines", [50, 1_000, 10**6])
def test_names_a_user_chooses_fold_by_blocks_as_a_line_at_a_time(block_lines):
    assert all(len(name.encode()) <= 15 for name in NAMES)
    lines = storm_of_names(NAMES)
    by_line, by_block = folds(lines, block_lines)
    assert_same(by_line, by_block)
    assert {e.xid for e in by_line.kernel_events()} == {95, 31, 119, 154}


@pytest.mark.parametrize("line", [
    "[ 2000.5] NVRM:Xid (PCI:0000:18:00): 95, pid=1, name=x, RST: Yes",  # no space after the tag
    "[NVRM: Xid (PCI:0000:18:00): 95, pid=1] NVRM: Xid (PCI:0000:2a:00): 95, pid=2, name=x, RST: Yes",
    "[ 2000.5] [VERBOSE] NVRM: Xid (PCI:0000:18:00): 95, pid=1, name=x, RST: No",
    "[ 2000.5] NVRM: Xid (PCI:0000:18:00):95,pid=1,name=x,RST: Yes",  # another spacing: kept whole
    "[ 2000.5] NVRM: Xid (PCI:0000:18:00): 95, pid=1, RST: Yes",  # no name=
    "[ 2000.5] NVRM: Xid (PCI:0000:18:00): 95,\x1cpid=1,\x1cname=x,\x1cRST: Yes",
    "[ 2000.5] NVRM: GPU at PCI:0000:5d:00: GPU has fallen off the bus.",
    "\t NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.",  # a record's later line
])
def test_odd_lines_among_a_storm_fold_by_blocks_as_a_line_at_a_time(line):
    lines = storm_of_names(["python3", "torchrun"], 600)
    lines[300:300] = [line] * 3
    by_line, by_block = folds(lines, 1_000)
    assert_same(by_line, by_block)
