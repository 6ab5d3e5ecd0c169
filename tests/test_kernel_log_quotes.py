"""Kernel messages count only where they start the record's message: the kernel quotes text a
user chooses, and that text must never fake a driver fault, a reset or a boot.

The two quoting messages are the kernel's own format strings (torvalds/linux, v6.6):
- fs/exec.c, do_execveat_common(): pr_warn_once("process '%s' launched '%s' with NULL argv:
  empty string added\\n", current->comm, bprm->filename) - the filename is any path a user makes;
- security/yama/yama_lsm.c, report_access(): pr_notice_ratelimited("ptrace %s of \\"%s\\"[%d] was
  attempted by \\"%s\\"[%d]\\n", access, target_cmd, target->pid, agent_cmd, current->pid) - both
  command lines are the processes' own.
Each is rendered as the sources reconcile reads print it (dmesg's `[ seconds]`, journalctl's
`host kernel:`), with the user's part carrying a real Xid 79 line or nvidia-smi's reset words."""

from __future__ import annotations

import pytest
from reconcile_host.reconcilers.gpus.fold import LogFold, parse_kernel_log

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:3b:00): 48, pid=4242, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."  # noqa: E501
RESET = "GPU 00000000:3B:00.0 was successfully reset."
BOOT = "Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org)"


def exec_warning(filename: str) -> str:
    return f"process 'x' launched '{filename}' with NULL argv: empty string added"


def yama(target_cmd: str) -> str:
    return f'ptrace attach of "{target_cmd}"[4243] was attempted by "gdb -p 4243"[4244]'


PREFIXES = ["[ 1843.308145] ", "Dec  4 12:00:00 gpu01 kernel: ", "[  518.101010] gpu01 kernel: ", ""]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("quote", [exec_warning, yama], ids=["exec-null-argv", "yama-ptrace"])
def test_a_quoted_xid_is_no_fault(prefix: str, quote) -> None:
    for payload in (XID79, f"/tmp/{XID79}", f"a {XID79}"):
        events, _ = parse_kernel_log(prefix + quote(payload) + "\n")
        assert events == (), (prefix, payload, events)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("quote", [exec_warning, yama], ids=["exec-null-argv", "yama-ptrace"])
def test_a_quoted_reset_or_boot_hides_no_real_fault(prefix: str, quote) -> None:
    for payload in (RESET, f"NVRM: {RESET}", BOOT):
        text = f"{prefix}{XID48}\n{prefix}{quote(payload)}\n"
        events, _ = parse_kernel_log(text)
        assert [(e.xid, e.current) for e in events] == [(48, True)], (payload, events)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_real_messages_still_count(prefix: str) -> None:
    events, _ = parse_kernel_log(f"{prefix}{XID79}\n")
    assert [(e.xid, e.pci, e.current) for e in events] == [(79, "0000:3b:00", True)]
    events, _ = parse_kernel_log(f"{prefix}{XID48}\n{prefix}{RESET}\n")
    assert [(e.xid, e.current) for e in events] == [(48, False)], "a real reset makes the fault history"


def test_the_block_fold_and_the_line_fold_agree_on_quoted_text() -> None:
    lines = []
    for i in range(200):
        lines.append(f"[ {100 + i}.000001] {XID48}")
        lines.append(f"[ {100 + i}.000002] {exec_warning(XID79)}")
        lines.append(f"[ {100 + i}.000003] {yama('NVRM: Xid (PCI:0000:5e:00): 63, pid=1, name=x, Row Remapper')}")
    block, each = LogFold(), LogFold()
    block.feed(text="\n".join(lines))
    each._feed_each(lines)
    assert [(e.xid, e.pci, e.count) for e in block.kernel_events(())] == \
        [(e.xid, e.pci, e.count) for e in each.kernel_events(())] == [(48, "0000:3b:00", 200)]
