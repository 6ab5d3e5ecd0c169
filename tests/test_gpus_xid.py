"""The kernel log and NVIDIA's Xid catalogue: the code's table against the ported catalogue, real
Xid lines (tests/data/gpus/xid-lines.yaml) in every form drivers print with the verdict the
catalogue gives, what counts since a GPU was last initialised. Reading the log: test_gpus_kernel_log.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from reconcile_host.reconcilers.gpus.catalogue import XIDS, recovery_from_text
from reconcile_host.reconcilers.gpus.fold import parse_kernel_log
from reconcile_host.reconcilers.gpus.xid import judge_xid, pci_key
from ruamel.yaml import YAML

DATA = Path(__file__).resolve().parent / "data" / "gpus"
CATALOGUE = YAML(typ="safe").load((DATA / "xid-catalogue.yaml").read_text())
LINES = YAML(typ="safe").load((DATA / "xid-lines.yaml").read_text())["lines"]


def test_code_table_is_nvidias_catalogue():
    ported = CATALOGUE["xids"]
    assert sorted(XIDS) == sorted(ported) == list(range(1, 173))
    for xid, entry in ported.items():
        assert XIDS[xid] == (entry["immediate_action"], entry["description"]), xid


@pytest.mark.parametrize("xid", sorted(CATALOGUE["xids"]))
def test_each_xid_keeps_a_job_off_as_the_catalogue_says(xid):
    entry = CATALOGUE["xids"][xid]
    keep, _, why = judge_xid(xid)
    if entry["keep_job_off"] == "depends":
        return  # decided by the line itself: test_real_xid_lines and the rules below
    assert keep is entry["keep_job_off"], (xid, entry["immediate_action"], why)


def test_the_xids_the_issue_names():
    """Where the old lists (k8s-device-plugin's, gcm's) differ from NVIDIA's catalogue."""
    for xid in (109, 48, 64, 95, 119, 120, 140, 143, 79):
        assert judge_xid(xid)[0], xid
    for xid in (8, 32, 63, 92, 94, 121, 13, 31, 43):
        assert not judge_xid(xid)[0], xid
    assert judge_xid(79)[1] == "RESTART_BM" and judge_xid(109)[1] == "RESET_GPU"


@pytest.mark.parametrize("entry", LINES, ids=[e["format"] for e in LINES])
def test_real_xid_lines(entry):
    events, _ = parse_kernel_log(entry["line"])
    verdict = entry.get("verdict") or entry.get("catalogue")
    if entry.get("parsed") is False or verdict is None:
        assert [e for e in events if e.keep_off] == [], "a preamble/notice is no event"
        return
    assert len(events) == 1, events
    ev = events[0]
    assert ev.xid == entry["xid"]
    assert ev.pci == entry["pci"]
    assert ev.gpu_instance == entry.get("mig_gpu_instance")
    assert ev.keep_off is verdict["keep_job_off"], (ev.why, verdict)
    assert ev.step == verdict["step"].split(" (")[0]
    assert "pid=" not in ev.detail and "name=" not in ev.detail


@pytest.mark.parametrize("detail, keep, step", [
    ("Contained: SM (0x1). RST: No, D-RST: No", False, "RESTART_APP"),
    ("Contained: SM (0x1). RST: Yes, D-RST: No", True, "RESET_GPU"),
    ("Uncontained: LTC TAG (0x2, 0x1). RST: No, D-RST: Yes", True, "DRAIN_AND_RESET"),
])
def test_94_carries_the_drivers_own_reset_verdict(detail, keep, step):
    assert judge_xid(94, detail)[:2] == (keep, step)


@pytest.mark.parametrize("xid, detail, keep, step", [
    (154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", True, "RESTART_BM"),
    (154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", False, "IGNORE"),
    (154, "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", True, "DRAIN_P2P"),
    (154, "GPU recovery action changed", True, "CONTACT_SUPPORT"),
    (149, "NETIR_LINK_EVT Nonfatal XC0 i0 Link 08 (0x004505c6 0x00000000)", False, "IGNORE"),
    (149, "NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000)", True, "RESET_GPU"),
    (144, "SAW_MVB Non-fatal 0x1", False, "IGNORE"),
    (74, "NVLink: fatal error detected on link 3", True, "RESET_GPU"),
    (45, "Ch 00000001 caused by previous Xid 79", True, "RESTART_BM"),
    (45, "Ch 00000001 caused by previous Xid 13", False, "IGNORE"),
    (45, "Ch 00000001", False, "IGNORE"),
    (172, "", True, "CONTACT_SUPPORT"),  # the catalogue gives no action yet: never ok
    (500, "", True, "CONTACT_SUPPORT"),  # not in the catalogue at all
])
def test_lines_that_decide_their_own_verdict(xid, detail, keep, step):
    assert judge_xid(xid, detail)[:2] == (keep, step)


def test_63_and_64_stand_for_the_remap_signal_under_mig():
    line = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 63, pid=1896, Row Remapper: New row marked for remapping\n"
    (plain,), _ = parse_kernel_log(line)
    (mig,), _ = parse_kernel_log(line, mig_pcis=["00000000:01:00.0"])
    assert not plain.keep_off  # NVML's remapped-rows pending says it where MIG is off
    assert mig.keep_off and mig.step == "reset the GPU" and mig.gpu_instance == 5


def test_whole_history_kept_repeats_folded():
    lines = [f"[{100 + i}.0] NVRM: Xid (PCI:0000:{i:02x}:00): 119, pid=1, name=x, Timeout after 6s" for i in range(30)]
    lines += ["[200.0] NVRM: Xid (PCI:0000:00:00): 119, pid=2, name=y, Timeout after 6s"] * 500
    lines.append("[900.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    events, _ = parse_kernel_log("\n".join(lines))
    assert len(events) == 31  # nothing dropped: the 31st distinct one (the 79) is there
    assert events[-1].xid == 79 and events[-1].keep_off
    assert events[0].count == 501 and events[0].first == "[100.0]" and events[0].last == "[200.0]"


def test_what_counts_since_the_gpu_was_last_initialised():
    log = "\n".join([
        "Dec  6 17:00:00 host kernel: [    0.000000] Linux version 6.1.0-18-amd64",
        "Dec  6 17:49:03 host kernel: [ 8659.7] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        "Dec  7 09:00:00 host kernel: [    0.000000] Linux version 6.1.0-18-amd64",  # the next boot
        "Dec  7 09:05:00 host kernel: [  300.0] NVRM: Xid (PCI:0000:3b:00): 48, DBE",
        "Dec  7 09:06:00 host kernel: [  360.0] NVRM: Xid (PCI:0000:5e:00): 95, Uncontained. RST: Yes, D-RST: No",
        "Dec  7 09:10:00 host root: GPU 00000000:3B:00.0 was successfully reset.",  # nvidia-smi -r | tee /dev/kmsg
        "Dec  7 09:20:00 host kernel: [ 1500.0] NVRM: Xid (PCI:0000:5e:00): 64, Row remapper failure",
    ])
    events, last = parse_kernel_log(log)
    state = {(e.pci, e.xid): e.current for e in events}
    assert state == {("0000:01:00", 79): False, ("0000:3b:00", 48): False, ("0000:5e:00", 95): True,
                     ("0000:5e:00", 64): True}
    assert "Linux version" in last
    events, last = parse_kernel_log(log + "\n[ 2000.0] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  "
                                          "570.158.01")
    assert not any(e.current for e in events) and "Open Kernel Module" in last


def test_fallen_off_the_bus_without_a_number_in_all_three_forms():
    for text, pci in [
        ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", "0000:18:00"),
        ("kernel: [ 8659.7] NVRM: GPU at 0000:01:00.0 has fallen off the bus.", "0000:01:00"),
        ("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: (PCI ID: 10de:26b5) installed in "
         "this system has\n               NVRM: fallen off the bus and is not responding to commands.", "0000:b3:00"),
    ]:
        (ev,), _ = parse_kernel_log(text)
        assert (ev.pci, ev.xid, ev.keep_off, ev.step) == (pci, None, True, "reboot the node")


@pytest.mark.parametrize("text, value", [
    ("None", 0), ("GPU Reset Required", 1), ("Node Reboot Required", 2), ("Drain P2P", 3),
    ("Drain and Reset", 4), ("[N/A]", None), ("Something New", -1),
])
def test_recovery_action_words(text, value):
    assert recovery_from_text(text) == value


def test_pci_keys():
    assert pci_key("00000000:3B:00.0") == pci_key("PCI:0000:3b:00") == pci_key("0000:3b:00.0") == "0000:3b:00"
    assert pci_key("00000009:01:00.0") == "0009:01:00"
