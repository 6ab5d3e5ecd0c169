"""The in-process unit-file reader: a unit's UnitFileState worked out from the manager's unit
search path and the units' [Install] sections, for the plain cases only; everything else is
handed to `systemctl show` (see the package docstring)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

# Where a unit file's state depends only on its [Install] section and on links to it. Units in
# the control, attached, transient and generator directories are left to systemd.
INSTALL_DIRS = frozenset({"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                          "/usr/lib/systemd/system", "/lib/systemd/system"})
# systemd reports "enabled" as soon as this directory holds a NAME link in a *.wants or
# *.requires directory (its `persistent_config`), whatever other links there are.
PERSISTENT_CONFIG = "/etc/systemd/system"


def parse_install(text: str) -> tuple[bool, bool] | None:
    """(has rules, has Also=) of a unit file's [Install] section, as systemd's install logic reads
    it: WantedBy=/RequiredBy=/Alias= make a unit "disabled" rather than "static", Also= alone
    makes it "indirect". An empty assignment resets the list. None where this simple reading might
    differ from systemd's (continuation lines in [Install], specifiers, quotes, .include,
    UpheldBy=, which older systemd ignores): the caller then asks systemd."""
    keys = {"WantedBy": [], "RequiredBy": [], "Alias": [], "Also": []}
    section = None
    continued = False
    for raw in text.splitlines():
        line = raw.strip()
        if continued:
            # Part of the previous line (an ExecStart= spread over lines, say): it cannot start a
            # section. A comment line in between is where versions of systemd differ.
            if section == "Install" or line.startswith(("[", "#", ";")):
                return None
            continued = line.endswith("\\")
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            if section == "Install" or line.startswith("["):
                return None
            continued = True
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                return None
            section = line[1:-1]
            continue
        if line.startswith(".include"):
            return None
        if section != "Install":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key == "UpheldBy" or (key in keys and any(c in value for c in "%\"'\\")):
            return None
        if key in keys:
            keys[key] = keys[key] + value.split() if value else []
    has_rules = bool(keys["WantedBy"] or keys["RequiredBy"] or keys["Alias"])
    return has_rules, bool(keys["Also"])


def has_install_section(text: str) -> bool:
    """Whether a drop-in may change the [Install] section (systemd 252 reads drop-ins' too)."""
    return any(line.strip().startswith("[Install") for line in text.splitlines())


class UnitFiles:
    """The unit search path read once: the first file or link of each name (the one systemd
    uses), every symlink (a link to a unit is what makes it enabled, indirect or linked), and
    the drop-in directories. `state(name)` is the UnitFileState systemd would report, for the
    plain cases only (systemd 252's unit_file_lookup_state, checked against it in tests):

    - the first entry of the name is a link to /dev/null: masked (masked-runtime under /run);
    - else it must be a non-empty regular file in one of INSTALL_DIRS, then
      - a NAME link to NAME in /etc/systemd/system/*.wants/ or *.requires/: enabled;
      - no symlink anywhere named NAME or pointing to NAME (directly or through an alias
        link): disabled, indirect or static, by its [Install] section.

    Everything else is None, for systemd to answer: aliases, linked units, links in /run or in
    vendor directories, drop-ins with an [Install] section, an [Install] section read as
    `parse_install` cannot be sure of. Costs one readlink per symlink and one read per declared
    unit file, where systemd scans every directory again for each unit. `root` is prepended to
    every path read (tests), never to the paths reported."""

    def __init__(self, search_path: Sequence[str], read_text: Callable[[str], str] | None = None, root: str = ""):
        self.read_text = read_text or _read_text
        self.root = root
        # name -> (path, link target; None for a regular file, "" for neither)
        self.first: dict[str, tuple[str, str | None]] = {}
        self.links: list[tuple[str, str]] = []  # (link name, target) of every symlink
        self.aliases: dict[str, set[str]] = {}  # top-level link name -> names of what it points to
        self.enabled: set[str] = set()  # names linked from /etc/systemd/system/*.wants|*.requires
        self.dropin_dirs: dict[str, list[str]] = {}  # "NAME.d" -> its paths
        self._referenced: set[str] | None = None
        for top in search_path:
            self._scan_top(top.rstrip("/") or "/")

    def _scan_top(self, top: str) -> None:
        try:
            entries = list(os.scandir(self.root + top))
        except FileNotFoundError:
            return
        for e in entries:
            path = f"{top}/{e.name}"
            if e.name.endswith(".d"):
                self.dropin_dirs.setdefault(e.name, []).append(path)
            if e.is_symlink():
                target = os.readlink(e.path)
                self.links.append((e.name, target))
                self.aliases.setdefault(e.name, set()).add(os.path.basename(target))
                self.first.setdefault(e.name, (path, target))
            elif e.is_dir(follow_symlinks=False):
                wants = top == PERSISTENT_CONFIG and e.name.endswith((".wants", ".requires"))
                self._scan_links(e.path, wants)
            else:
                # A regular file; anything else (a FIFO, say) is not read here: state() defers.
                self.first.setdefault(e.name, (path, None if e.is_file(follow_symlinks=False) else ""))

    def _scan_links(self, path: str, wants: bool, depth: int = 1) -> None:
        # Every symlink below the top level, not just in *.wants: more links than systemd looks at
        # only means more units left to systemd, never a wrong state.
        for e in os.scandir(path):
            if e.is_symlink():
                target = os.readlink(e.path)
                self.links.append((e.name, target))
                if wants and os.path.basename(target) == e.name:
                    self.enabled.add(e.name)
            elif e.is_dir(follow_symlinks=False) and depth < 8:
                self._scan_links(e.path, False, depth + 1)

    def referenced(self) -> set[str]:
        """Names some symlink has or points to, through chains of alias links."""
        if self._referenced is None:
            seen: set[str] = set()
            for name, target in self.links:
                seen.add(name)
                todo = [os.path.basename(target)]
                while todo:
                    n = todo.pop()
                    if n not in seen:
                        seen.add(n)
                        todo.extend(self.aliases.get(n, ()))
            self._referenced = seen
        return self._referenced

    def state(self, name: str) -> tuple[str, str] | None:
        """(UnitFileState, unit file path) where it is certain; None: ask systemd."""
        entry = self.first.get(name)
        if entry is None:
            return None  # no unit file: not found, or a unit made without one (device, mount, scope)
        path, target = entry
        if target is not None:
            if target == "/dev/null":
                return ("masked-runtime" if path.startswith("/run/") else "masked"), path
            return None  # an alias, a linked unit file, not a file at all
        if os.path.dirname(path) not in INSTALL_DIRS:
            return None
        try:
            text = self.read_text(self.root + path)
        except (OSError, UnicodeDecodeError):
            return None
        rules = parse_install(text) if text else None  # an empty unit file masks the unit
        if rules is None or self._dropins_touch_install(name):
            return None
        if name in self.enabled:
            return "enabled", path
        if name in self.referenced():
            return None
        has_rules, has_also = rules
        return ("disabled" if has_rules else "indirect" if has_also else "static"), path

    def _dropins_touch_install(self, name: str) -> bool:
        stem, _, suffix = name.rpartition(".")
        dirs = [f"{name}.d", f"{suffix}.d"]  # the unit's own, and those for every unit of its type
        parts = stem.split("-")
        dirs += [f"{'-'.join(parts[:i])}-.{suffix}.d" for i in range(1, len(parts))]  # foo-.service.d
        for d in dirs:
            for path in self.dropin_dirs.get(d, ()):
                try:
                    for conf in os.scandir(self.root + path):
                        if has_install_section(self.read_text(conf.path)):
                            return True
                except (OSError, UnicodeDecodeError):
                    return True
        return False


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        return fh.read()
