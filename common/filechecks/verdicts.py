"""What the check of one sample file says (integrity.py says how it is checked).

Plain data apart from the checks, so that the kind and the tally can name depths and states
without importing the archive readers: those are imported only when a file is to be checked
(not in `diff`'s parent process, and not in the steady state, where every file is as last seen).
"""

from __future__ import annotations

import os
from typing import NamedTuple

STAT, STRUCTURE, CONTENT = "stat", "structure", "content"
WHOLE, DAMAGED, UNREADABLE, GONE, UNCHECKED = "whole", "damaged", "unreadable", "gone", "unchecked"
# Well-formed, but its content cannot be proven what was written, nor shown damaged (a safetensors
# file ending in zeros where zeros may be data): counted done, never moved, said in a caveat.
UNPROVEN = "unproven"


class Verdict(NamedTuple):  # a tuple: a million of them are made, and sent between processes
    state: str  # WHOLE, DAMAGED, UNREADABLE, GONE (vanished since listed), UNCHECKED (depth STAT), UNPROVEN
    reason: str = ""  # why DAMAGED, UNREADABLE or UNPROVEN
    depth: str = STRUCTURE  # how deep the check went
    st: os.stat_result | None = None
    no_crc: bool = False  # a torch.save ZIP without CRCs: its tensor bytes cannot be proven
    gz_shallow: bool = False  # a .gz whose header only was read (not decompressed)
    trailing: int = 0  # bytes after the ZIP end record, ignored as torch.load ignores them
    # A structural verdict whose read also proved every entry's CRC (check_path's `crcs_from`):
    # what at-risk's whole read of it would say, without a second read (tally._recent_pass).
    crcs_proven: bool = False

    @property
    def whole(self) -> bool:
        return self.state == WHOLE
