"""Where the kinds that move damaged files aside put them: one folder name and one naming rule
for every quarantine, so a person finds them the same way whichever kind moved them (nothing
reconcile moves is ever deleted)."""

from __future__ import annotations

import os
import time

QUARANTINE = ".reconcile-quarantine"


def new_quarantine_dir(root: str, folder: str = QUARANTINE) -> str:
    """A folder name not yet taken under ROOT/FOLDER for one quarantine: the UTC time, `-2`, `-3`
    ... after it when two quarantines fall in one second (not created here)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    qdir = os.path.join(root, folder, stamp)
    n = 1
    while os.path.exists(qdir):
        n += 1
        qdir = os.path.join(root, folder, f"{stamp}-{n}")
    return qdir
