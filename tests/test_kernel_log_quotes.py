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


# --- a newline in the quoted text: the record's later lines -------------------------------------

@pytest.mark.parametrize("quote", [exec_warning, yama], ids=["exec-null-argv", "yama-ptrace"])
def test_a_newline_in_the_quoted_text_starts_no_record(quote) -> None:
    """exec's filename is any path, newlines included (Yama's command line is escaped by
    kstrdup_quotable_cmdline, exec's is not). dmesg and journalctl print a record's later lines
    indented under it: such a line is never a message of its own."""
    for indent in (" " * 15, " " * 34, "\t"):
        for payload in (XID79, RESET, BOOT):
            text = f"[  100.000001] {XID48}\n[  101.000001] {quote('/tmp/x')}\n" \
                   f"[  102.000001] {quote('/tmp/x' + chr(10) + indent + payload)}\n"
            events, last_init = parse_kernel_log(text)
            assert [(e.xid, e.current) for e in events] == [(48, True)], (indent, payload, events)
            assert last_init == ""


def test_only_the_kernels_own_tag_prefixes_a_driver_message() -> None:
    """`host kernel:` (journalctl, rsyslog) is the kernel's tag; any other `word:` before `NVRM:`
    is a message's own text (a driver naming a device a user named)."""
    assert parse_kernel_log(f"[  12.000001] gpu01 kernel: {XID79}\n")[0]
    for head in ("[  12.000001] veth0: ", "[  12.000001] gpu01 python3[77]: ", "Dec  4 12:00:00 gpu01 sudo: "):
        assert parse_kernel_log(f"{head}{XID79}\n")[0] == (), head


def _kmsg_record(seq: int, message: str) -> str:
    """A /dev/kmsg record as the kernel gives it (Documentation/ABI/testing/dev-kmsg): the
    message's newlines and other control bytes escaped as \\xNN, a dictionary line after it."""
    escaped = "".join(c if " " <= c < "\x7f" and c != "\\" else f"\\x{ord(c):02x}" for c in message)
    return f"4,{seq},{seq * 1000 + 5},-;{escaped}\n SUBSYSTEM=pci\n"


def test_a_kmsg_record_quoting_a_newline_fakes_nothing(tmp_path, monkeypatch) -> None:
    from reconcile_host.reconcilers.gpus.kernel_log import read_kernel_log

    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("RECONCILE_KERNEL_LOG", raising=False)
    (tmp_path / "boot_id").write_text("boot-1\n")
    monkeypatch.setenv("RECONCILE_BOOT_ID_FILE", str(tmp_path / "boot_id"))
    ring = tmp_path / "kmsg"
    ring.write_text(_kmsg_record(0, BOOT) + _kmsg_record(1, XID48)
                    + _kmsg_record(2, exec_warning("/tmp/x\n" + XID79))
                    + _kmsg_record(3, exec_warning("/tmp/x\n" + RESET))
                    + _kmsg_record(4, yama("x\n" + BOOT)))
    monkeypatch.setenv("RECONCILE_KMSG", str(ring))
    fold, log = read_kernel_log()
    assert log.complete and log.lines_read == 5
    assert [(e.xid, e.pci, e.current) for e in fold.kernel_events(())] == [(48, "0000:3b:00", True)]
    # The driver's own multi-line record is still read as its lines (the probe message).
    probe = "NVRM: The NVIDIA GPU 0000:5d:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system has\n" \
            "NVRM: fallen off the bus and is not responding to commands."
    ring.write_text(_kmsg_record(0, BOOT) + _kmsg_record(1, probe))
    (tmp_path / "state" / "gpus-kernel-log.json").unlink()
    fold, _ = read_kernel_log()
    assert [(e.xid, e.pci, e.current) for e in fold.kernel_events(())] == [(None, "0000:5d:00", True)]
