"""Lightning Fabric checkpoints (lightning 2.6.6). Fabric has no resume rule of its own:
`Fabric.save(path, state)` writes one torch.save archive wherever the script says (a folder only
with a sharded strategy), `Fabric.load(path, state)` reads it whole. So the rule is declared:
`pattern:` (which entries of dir are checkpoints, fnmatch on the name) and `pick:`:
- lexicographic: the last of the sorted names, the rule of Fabric's own example
  (examples/fabric/build_your_own_trainer/trainer.py, MyCustomTrainer.get_latest_checkpoint:
  `items = sorted(os.listdir(checkpoint_dir)); return os.path.join(checkpoint_dir, items[-1])`;
  its saves: `f"epoch-{self.current_epoch:04d}.ckpt"`);
- highest-number: the highest first number in the name (entries without one are not candidates);
- newest-mtime: the newest modification time.
A checkpoint's number in the report is its place in that order (1 the first). Apply only moves
torn checkpoints aside, beside dir (a rule over every entry of dir, as the example's, would pick
a quarantine folder inside it), and never creates a file the rule could pick.
Imported only in the observer child; read through the tree held by fd.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from typing import Any

from ...common.usertree import Tree
from .observed import NotCheckable, StepObserved
from .treefiles import check_file

NUMBER = re.compile(r"\d+")
RULES = {
    "lexicographic": "the last of the sorted names matching {pattern} (Fabric's build_your_own_trainer example, "
                     "get_latest_checkpoint: sorted(os.listdir(dir))[-1])",
    "highest-number": "the highest first number in the names matching {pattern} (declared)",
    "newest-mtime": "the newest modification time among the entries matching {pattern} (declared)",
}
EMPTY_PICK = ("the declared rule picks nothing: a script like Fabric's build_your_own_trainer example "
              "(get_latest_checkpoint returns None) trains from scratch")


def rule(spec: dict[str, Any]) -> str:
    return RULES[spec["pick"]].format(pattern=spec["pattern"])


def ordered(tree: Tree, spec: dict[str, Any]) -> list[str]:
    """The entries matching the pattern, oldest first by the declared pick (the last is the pick)."""
    found = [e for e in tree.entries() if fnmatch.fnmatchcase(e.name, spec["pattern"])]
    for e in found:
        if e.kind == "dir":
            raise NotCheckable(f"{tree.path}/{e.name}: a folder (a sharded Fabric save): the fabric layout checks "
                               "single-file saves only")
        if e.kind != "file":
            raise NotCheckable(f"{tree.path}/{e.name}: not a regular file ({e.kind}): not read")
    pick = spec["pick"]
    if pick == "lexicographic":
        return sorted(e.name for e in found)
    if pick == "highest-number":
        numbered = [(int(m.group()), e.name) for e in found if (m := NUMBER.search(e.name))]
        return [n for _, n in sorted(numbered)]
    return [e.name for e in sorted(found, key=lambda e: (e.mtime_ns, e.name))]


def resume(tree: Tree, spec: dict[str, Any]) -> str | None:
    order = ordered(tree, spec)
    return order[-1] if order else None


def steps(tree: Tree, names: list[str], depth_of: Callable[[str], str], spec: dict[str, Any]) -> list[StepObserved]:
    place = {n: i + 1 for i, n in enumerate(ordered(tree, spec))}
    out = []
    for n in names:
        st = tree.lstat(n)
        ok, why = check_file(tree, n, depth_of(n))
        out.append(StepObserved(place.get(n), n, ok, "" if ok else why, st.st_mtime, 1, st.st_size,
                                why if ok else ""))
    return out
