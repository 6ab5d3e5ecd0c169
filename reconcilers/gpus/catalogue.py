"""NVIDIA's Xid catalogue and the GPU recovery actions: what a person must do about a GPU.

The table is NVIDIA's Xid catalogue (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
the spreadsheet Xid-Catalog.xlsx linked there): for each Xid its description and its *immediate
action*, as transcribed by leptonai/gpud@4a8de33a3f02 components/accelerator/nvidia/xid/catalog_generated.go
(Apache-2.0, generated 2025-10-29). tests/data/gpus/xid-catalogue.yaml holds the same transcription
with its provenance, and tests/test_gpus_xid.py keeps this table equal to it.

The recovery actions are NVML's `NVML_GPU_RECOVERY_ACTION_*` (field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`
= 230, nvidia-ml-py 13.615 pynvml.py; nvidia-smi `gpu_recovery_action`), which Xid 154 announces.

How reconcile reads the immediate action (NVIDIA gives the action, the project decides what
keeps a job off the GPU): RESTART_APP and IGNORE do not (the application, not the GPU, was at
fault, or nothing is to be done); every other action does, and names the step; the WORKFLOW_*
and XID_154 entries depend on the line itself (see xid.judge_xid).
"""

from __future__ import annotations

# (action, step shown to a person, rank): the highest-ranked step of a GPU is the one to take
# first (rebooting the node also resets the GPU; resetting it does not reboot the node).
STEPS: dict[str, tuple[str, int]] = {
    "RESTART_BM": ("reboot the node", 60),
    "SYSTEM_REBOOT": ("reboot the node", 60),
    "RESTART_VM": ("restart the VM", 58),
    "DRAIN_AND_RESET": ("drain the GPU's work, then reset the GPU", 50),
    "BUS_RESET": ("reset the GPU's PCIe bus (or reboot the node)", 45),
    "RESET_GPU": ("reset the GPU", 40),
    "RECOVER_IMEX_DOMAIN": ("recover the GPU's IMEX domain", 35),
    "DRAIN_P2P": ("drain peer-to-peer traffic from the GPU", 30),
    "CHECK_MECHANICALS": ("check the GPU's power cables and seating", 25),
    "UPDATE_SWFW": ("update the NVIDIA driver and firmware", 20),
    "CHECK_UVM": ("check the nvidia-uvm kernel module", 15),
    "CONTACT_SUPPORT": ("contact NVIDIA support", 10),
}
# Immediate actions that keep no job off the GPU.
HARMLESS = {"RESTART_APP": "restart the application", "IGNORE": "none"}

# NVML_GPU_RECOVERY_ACTION_* value -> the STEPS key (0: nothing to do).
RECOVERY_ACTIONS: dict[int, str | None] = {
    0: None,
    1: "RESET_GPU",
    2: "RESTART_BM",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
    5: "RECOVER_IMEX_DOMAIN",
    6: "BUS_RESET",
    7: "SYSTEM_REBOOT",
}
RECOVERY_NAMES = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset",
                  5: "recover_imex_domain", 6: "bus_reset", 7: "system_reboot"}


def step_text(action: str) -> str:
    return STEPS[action][0] if action in STEPS else HARMLESS.get(action, action)


def step_rank(action: str) -> int:
    return STEPS[action][1] if action in STEPS else 0


def recovery_from_text(text: str) -> int | None:
    """nvidia-smi's `gpu_recovery_action` / Xid 154's words -> the NVML value; None: not a value.

    nvidia-smi prints `None` on every capture in tests/data/gpus/real/; Xid 154 lines name the
    action as `0x1 (GPU Reset Required)`, `Node Reboot Required`, `Drain P2P`, `Drain and Reset`."""
    t = " ".join(text.lower().replace("_", " ").split())
    if not t or t in ("n/a", "[n/a]", "not supported", "[not supported]"):
        return None
    if t == "none":
        return 0
    for words, value in ((("drain", "reset"), 4), (("drain", "p2p"), 3), (("imex",), 5), (("bus", "reset"), 6),
                         (("system", "reboot"), 7), (("reboot",), 2), (("reset",), 1)):
        if all(w in t for w in words):
            return value
    return -1  # a value reconcile does not know: never read as none


# Xid -> (NVIDIA's immediate action, description). None: the catalogue gives no action yet.
XIDS: dict[int, tuple[str | None, str]] = {
    1: ("CONTACT_SUPPORT", "Unused"),
    2: ("CONTACT_SUPPORT", "Unused"),
    3: ("CONTACT_SUPPORT", "Unused"),
    4: ("CONTACT_SUPPORT", "Unused"),
    5: ("CONTACT_SUPPORT", "Unused"),
    6: ("CONTACT_SUPPORT", "Unused"),
    7: ("CONTACT_SUPPORT", "Unused"),
    8: ("RESTART_APP", "GPU stopped processing"),
    9: ("CONTACT_SUPPORT", "Unused"),
    10: ("CONTACT_SUPPORT", "Unused"),
    11: ("RESTART_APP", "Invalid or corrupted push buffer stream"),
    12: ("CONTACT_SUPPORT", "Unused"),
    13: ("RESTART_APP", "Graphics Engine Exception"),
    14: ("IGNORE", "Unused"),
    15: ("CONTACT_SUPPORT", "Unused"),
    16: ("CONTACT_SUPPORT", "Unused"),
    17: ("CONTACT_SUPPORT", "Unused"),
    18: ("CONTACT_SUPPORT", "Unused"),
    19: ("CONTACT_SUPPORT", "Unused"),
    20: ("CONTACT_SUPPORT", "Unused"),
    21: ("CONTACT_SUPPORT", "Unused"),
    22: ("CONTACT_SUPPORT", "Unused"),
    23: ("CONTACT_SUPPORT", "Unused"),
    24: ("CONTACT_SUPPORT", "Unused"),
    25: ("RESTART_APP", "Invalid or illegal push buffer stream"),
    26: ("CONTACT_SUPPORT", "Unused"),
    27: ("CONTACT_SUPPORT", "Unused"),
    28: ("CONTACT_SUPPORT", "Unused"),
    29: ("CONTACT_SUPPORT", "Unused"),
    30: ("CONTACT_SUPPORT", "Unused"),
    31: ("RESTART_APP", "GPU memory page fault"),
    32: ("RESTART_APP", "Invalid or corrupted push buffer stream"),
    33: ("CONTACT_SUPPORT", "Unused"),
    34: ("CONTACT_SUPPORT", "Unused"),
    35: ("CONTACT_SUPPORT", "Unused"),
    36: ("CONTACT_SUPPORT", "Unused"),
    37: ("IGNORE", "Driver firmware error"),
    38: ("IGNORE", "Driver firmware error"),
    39: ("RESTART_APP", "Copy Engine Exception"),
    40: ("RESTART_APP", "Copy Engine Exception"),
    41: ("RESTART_APP", "Copy Engine Exception"),
    42: ("CONTACT_SUPPORT", "Unused"),
    43: ("IGNORE", "GPU stopped processing"),
    44: ("IGNORE", "Graphics Engine fault during context switch"),
    45: ("WORKFLOW_XID_45", "Preemptive cleanup, due to previous errors -- Most likely"
                           " to see when running multiple cuda applications and hitting a DBE"),
    46: ("RESET_GPU", "GPU stopped processing"),
    47: ("CONTACT_SUPPORT", "Unused"),
    48: ("WORKFLOW_XID_48", "Double Bit ECC Error"),
    49: ("CONTACT_SUPPORT", "Unused"),
    50: ("CONTACT_SUPPORT", "Unused"),
    51: ("CONTACT_SUPPORT", "Unused"),
    52: ("CONTACT_SUPPORT", "Unused"),
    53: ("CONTACT_SUPPORT", "Unused"),
    54: ("CHECK_MECHANICALS", "Auxiliary power is not connected to the GPU board"),
    55: ("CONTACT_SUPPORT", "Unused"),
    56: ("CONTACT_SUPPORT", "Unused"),
    57: ("CONTACT_SUPPORT", "Unused"),
    58: ("CONTACT_SUPPORT", "Unused"),
    59: ("CONTACT_SUPPORT", "Unused"),
    60: ("RESTART_APP", "Video processor exception"),
    61: ("CONTACT_SUPPORT", "Unused"),
    62: ("RESET_GPU", "Internal micro-controller halt (newer drivers)"),
    63: ("IGNORE", "GPU memory remapping event"),
    64: ("RESET_GPU", "GPU memory remapping failure"),
    65: ("CONTACT_SUPPORT", "Unused"),
    66: ("IGNORE", "Illegal access by driver"),
    67: ("IGNORE", "Illegal access by driver"),
    68: ("RESTART_APP", "NVDEC0 Exception"),
    69: ("RESTART_APP", "Graphics Engine class error"),
    70: ("RESTART_APP", "CE3: Unknown Error"),
    71: ("RESTART_APP", "CE4: Unknown Error"),
    72: ("RESTART_APP", "CE5: Unknown Error"),
    73: ("CONTACT_SUPPORT", "Unused"),
    74: ("WORKFLOW_NVLINK_ERR", "NVLINK Error"),
    75: ("RESTART_APP", "CE6: Unknown Error"),
    76: ("RESTART_APP", "CE7: Unknown Error"),
    77: ("RESTART_APP", "CE8: Unknown Error"),
    78: ("UPDATE_SWFW", "vGPU Start Error"),
    79: ("RESTART_BM", "GPU has fallen off the bus"),
    80: ("RESTART_APP", "Corrupted data sent to GPU"),
    81: ("CONTACT_SUPPORT", "Unused"),
    82: ("RESTART_APP", "NVJPG0 Error"),
    83: ("RESTART_APP", "NVDEC1 Error"),
    84: ("RESTART_APP", "NVDEC2 Error"),
    85: ("RESTART_APP", "CE9: Unknown Error"),
    86: ("RESTART_APP", "OFA Exception"),
    87: ("CONTACT_SUPPORT", "Unused"),
    88: ("RESTART_APP", "NVDEC3 Error"),
    89: ("RESTART_APP", "NVDEC4 Error"),
    90: ("CONTACT_SUPPORT", "Unused"),
    91: ("CONTACT_SUPPORT", "Unused"),
    92: ("IGNORE", "High single-bit ECC error rate"),
    93: ("IGNORE", "Non-fatal violation of provisioned InfoROM wear limit"),
    94: ("RESTART_APP", "Contained memory error"),
    95: ("RESET_GPU", "Uncontained memory error"),
    96: ("RESTART_APP", "NVDEC5 Error"),
    97: ("RESTART_APP", "NVDEC6 Error"),
    98: ("RESTART_APP", "NVDEC7 Error"),
    99: ("RESTART_APP", "NVJPG1 Error"),
    100: ("RESTART_APP", "NVJPG2 Error"),
    101: ("RESTART_APP", "NVJPG3 Error"),
    102: ("RESTART_APP", "NVJPG4 Error"),
    103: ("RESTART_APP", "NVJPG5 Error"),
    104: ("RESTART_APP", "NVJPG6 Error"),
    105: ("RESTART_APP", "NVJPG7 Error"),
    106: ("IGNORE", "SMBPBI Test Message"),
    107: ("IGNORE", "SMBPBI Test Message Silent"),
    108: ("IGNORE", "Unused"),
    109: ("RESET_GPU", "Context Switch Timeout Error"),
    110: ("RESET_GPU", "Security Fault Error"),
    111: ("CONTACT_SUPPORT", "Unused"),
    112: ("CONTACT_SUPPORT", "Unused"),
    113: ("CONTACT_SUPPORT", "Unused"),
    114: ("CONTACT_SUPPORT", "Unused"),
    115: ("CONTACT_SUPPORT", "Unused"),
    116: ("CONTACT_SUPPORT", "Unused"),
    117: ("CONTACT_SUPPORT", "Unused"),
    118: ("CONTACT_SUPPORT", "Unused"),
    119: ("RESET_GPU", "GSP RPC Timeout"),
    120: ("RESET_GPU", "GSP Error"),
    121: ("IGNORE", "C2C Error"),
    122: ("CONTACT_SUPPORT", "Unused"),
    123: ("CONTACT_SUPPORT", "Unused"),
    124: ("CONTACT_SUPPORT", "Unused"),
    125: ("CONTACT_SUPPORT", "Unused"),
    126: ("RESTART_APP", "CE10: Unknown Error"),
    127: ("RESTART_APP", "CE11: Unknown Error"),
    128: ("RESTART_APP", "CE12: Unknown Error"),
    129: ("RESTART_APP", "CE13: Unknown Error"),
    130: ("RESTART_APP", "CE14: Unknown Error"),
    131: ("RESTART_APP", "CE15: Unknown Error"),
    132: ("RESTART_APP", "CE16: Unknown Error"),
    133: ("RESTART_APP", "CE17: Unknown Error"),
    134: ("RESTART_APP", "CE18: Unknown Error"),
    135: ("RESTART_APP", "CE19: Unknown Error"),
    136: ("RESET_GPU", "Link Training Failed"),
    137: ("IGNORE", "NVLink Privilege Error"),
    138: ("CONTACT_SUPPORT", "Unused"),
    139: ("RESTART_APP", "OFA1 Error"),
    140: ("RESET_GPU", "ECC Unrecovered Error"),
    141: ("IGNORE", "CUDA Fast Path Error"),
    142: ("CONTACT_SUPPORT", "NVENC3 Error"),
    143: ("RESET_GPU", "GPU Initialization Error"),
    144: ("WORKFLOW_NVLINK5_ERR", "NVLINK: SAW Error"),
    145: ("WORKFLOW_NVLINK5_ERR", "NVLINK: RLW Error"),
    146: ("WORKFLOW_NVLINK5_ERR", "NVLINK: TLW Error"),
    147: ("WORKFLOW_NVLINK5_ERR", "NVLINK: TREX Error"),
    148: ("WORKFLOW_NVLINK5_ERR", "NVLINK: NVLPW_CTRL Error"),
    149: ("WORKFLOW_NVLINK5_ERR", "NVLINK: NETIR Error"),
    150: ("WORKFLOW_NVLINK5_ERR", "NVLINK: MSE Error"),
    151: ("RESTART_VM", "Key rotation Error"),
    152: ("IGNORE", "DLA SMMU Error"),
    153: ("IGNORE", "DLA timeout Error"),
    154: ("XID_154", "GPU Recovery Action Changed"),
    155: ("RESET_GPU", "NVLINK: SW Defined Error"),
    156: ("RESET_GPU", "Resource Retirement Event"),
    157: ("IGNORE", "Resource Retirement Failure"),
    158: ("RESET_GPU", "GPU Fatal Timeout"),
    159: ("CHECK_UVM", "CHI Non-Data Error"),
    160: ("IGNORE", "Channel Retirement Event"),
    161: ("IGNORE", "Channel Retirement Failure"),
    162: (None, "Power Smoothing HW Circuitry capability reengaged"),
    163: (None, "Power Smoothing HW Circuitry capability disengaged"),
    164: (None, "Power Smoothing HW Circuitry low lifetime reached"),
    165: (None, "Power Smoothing HW Circuitry lifetime exhausted"),
    166: (None, "CC traffic seen prior to link properly being configured for encrypted traffic"),
    167: (None, "PCIE_FATAL_TIMEOUT"),
    168: (None, "Errors found in WPR (write protected region)"),
    169: (None, "Internal micro-controller halt"),
    170: (None, "Interrupt seen in CC mode"),
    171: (None, "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM"),
    172: (None, "Additional to Xid 48 providing more details on particulars of fault to differentiate DRAM/SRAM"),
}
