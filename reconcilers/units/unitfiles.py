"""The in-process unit-file reader: a unit's UnitFileState worked out from the manager's unit
search path, for the cases where it can follow systemd 252 exactly; every other unit is handed
to `systemctl show` (see the package docstring).

It answers what `systemctl is-enabled` would (install.c:unit_file_lookup_state reads the disk
each time it is asked), which is also what `show` says for a unit systemd loads for the
question. For a unit systemd holds in memory, `show` repeats the state it worked out when it
loaded the unit, until a daemon-reload; the disk's answer is the one reconcile reports (what the
next boot and `systemctl enable/disable` act on; docs/units.md, "daemon-reload")."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .syntax import Unsure, hidden_or_backup, name_kind, parse_all, unit_type

# Where a regular unit file's state depends only on its [Install] section and on links to it
# (not generated, not transient: install.c:path_is_generator, path_is_transient; the control
# and attached directories are left to systemd too).
INSTALL_DIRS = frozenset({"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
                          "/usr/lib/systemd/system", "/lib/systemd/system"})
# install.c:find_symlinks_in_scope: links found in this directory (lp->persistent_config) make a
# unit "enabled" at once; links found anywhere under /run (path_is_runtime), "enabled-runtime".
PERSISTENT_CONFIG = "/etc/systemd/system"
# Unit types the manager never loads from a unit file (scope: made through the bus; device: by
# udev): `show` says not-found and no UnitFileState for them, whatever is-enabled reads on disk.
NO_UNIT_FILES = frozenset({"scope", "device"})

_REGULAR, _LINK, _OTHER = "regular", "link", "other"


class _Dir:
    """One directory of the search path, read once: the kind of every entry (for the lookup of a
    name, which sees hidden names too), the top-level links that are not hidden
    (find_symlinks_in_directory(ignore_destination=false)), and the names of the links in its
    *.wants/ and *.requires/ subdirectories (find_symlinks: matched by name, never followed)."""

    __slots__ = ("path", "entries", "links", "wants")

    def __init__(self, path: str, root: str, same_as: _Dir | None = None):
        self.path = path
        if same_as is not None:  # the same directory under another name (/lib is /usr/lib)
            self.entries, self.links, self.wants = same_as.entries, same_as.links, same_as.wants
            return
        self.entries: dict[str, tuple[str, str | None]] = {}  # name -> (kind, link target)
        # (link name, basename of what it points to); the basename does not depend on the
        # directory the link is in, so the listing can be shared with the directory's other names
        self.links: list[tuple[str, str]] = []
        self.wants: set[str] = set()
        try:
            it = os.scandir(root + path)
        except (FileNotFoundError, NotADirectoryError):
            return
        with it:
            for e in it:
                name = e.name
                if e.is_symlink():
                    target = os.readlink(e.path)
                    self.entries[name] = (_LINK, target)
                    if not hidden_or_backup(name):
                        self.links.append((name, os.path.basename(target)))
                elif e.is_dir(follow_symlinks=False):
                    self.entries[name] = (_OTHER, None)
                    if name.endswith((".wants", ".requires")) and not hidden_or_backup(name):
                        self._scan_wants(e.path)
                elif e.is_file(follow_symlinks=False):
                    self.entries[name] = (_REGULAR, None)
                else:
                    self.entries[name] = (_OTHER, None)  # a FIFO, socket or device: never opened here

    def _scan_wants(self, path: str) -> None:
        try:
            with os.scandir(path) as it:
                for e in it:
                    if e.is_symlink() and not hidden_or_backup(e.name):
                        self.wants.add(e.name)
        except OSError:
            pass  # find_symlinks: "Failed to open directory ..., ignoring"


class UnitFiles:
    """The unit search path read once. `state(name)` is the UnitFileState systemd 252 would
    report (install.c:unit_file_lookup_state), or None where this reader is not certain to match
    it. It settles a plain name (no @) whose first entry in the search path is

    - a link to /dev/null, or an empty regular file: masked (masked-runtime under /run);
    - a non-empty regular file in one of INSTALL_DIRS, whose file and drop-ins (NAME.d/*.conf)
      `syntax.parse_install` reads without doubt: then enabled / enabled-runtime / indirect by
      the links to it (find_symlinks_in_scope), else disabled / indirect / static by its
      [Install] lists.

    Everything else is systemd's to answer: instances, aliases and linked unit files, generated
    and transient units, names not found, entries that are not files, files systemd would call
    `bad`. Costs one scandir per directory and one readlink per link, once, and one read per
    declared unit file (and drop-in), where systemd scans every directory again for each unit.
    `root` is prepended to every path read (tests), never to the paths reported."""

    def __init__(self, search_path: Sequence[str], root: str = ""):
        self.root = root
        self.search_path = [p.rstrip("/") or "/" for p in search_path]
        self.dirs: list[_Dir] = []
        by_real: dict[str, _Dir] = {}
        for p in self.search_path:
            real = os.path.realpath(root + p)
            d = _Dir(p, root, by_real.get(real))
            by_real.setdefault(real, d)
            self.dirs.append(d)

    def state(self, name: str) -> tuple[str, str] | None:
        """(UnitFileState, unit file path) where it is certain; None: ask systemd."""
        if name_kind(name) != "plain" or unit_type(name) in NO_UNIT_FILES:
            return None
        found = self._first(name)
        if found is None:
            return None  # not found, or a unit without a unit file (init.scope, a device)
        d, (kind, target) = found
        path = f"{d.path}/{name}"
        runtime = path.startswith("/run/")  # install.c:path_is_runtime
        if kind == _LINK:
            # unit_file_load_or_readlink: a link out of the search path to /dev/null is a mask.
            if target == "/dev/null":
                return ("masked-runtime" if runtime else "masked"), path
            return None  # an alias, a linked unit file, a dangling or looping link
        if kind != _REGULAR or d.path not in INSTALL_DIRS:
            return None  # a directory (EISDIR: bad), a FIFO, socket or device; generated, transient
        try:
            with open(self.root + path, "rb") as fh:
                main = fh.read()
        except OSError:
            return None
        if not main:
            # stat-util.c:null_or_empty: an empty unit file masks the unit (unit_file_load).
            return ("masked-runtime" if runtime else "masked"), path
        dropins = self._dropins(name)
        if dropins is None:
            return None
        try:
            info = parse_all([main, *dropins], unit_type(name))
        except Unsure:
            return None
        links = self._links(name, d.path, info.aliases)
        if links is None:
            return None
        if links:
            return links, path
        return ("disabled" if info.has_rules else "indirect" if info.also else "static"), path

    def _first(self, name: str) -> tuple[_Dir, tuple[str, str | None]] | None:
        """install.c:unit_file_search: the first directory of the search path with an entry of
        this name (looked up directly, so hidden names are found; any entry ends the search, a
        directory too: it makes the unit bad)."""
        for d in self.dirs:
            entry = d.entries.get(name)
            if entry is not None:
                return d, entry
        return None

    def _dropins(self, name: str) -> list[bytes] | None:
        """install.c:unit_file_search, conf-files.c:conf_files_list_strv: NAME.d/*.conf in every
        directory of the search path (not the type-wide service.d/ nor the prefix foo-.service.d/:
        only the manager reads those, and they do not change the state), hidden and backup names
        skipped, a file name in an earlier directory hiding the same name later, read in the
        order of their names. None where a drop-in is anything but a regular file (a directory
        or a dangling link makes the unit bad; a link is left to systemd)."""
        chosen: dict[str, str] = {}
        seen_dirs: set[str] = set()
        for d in self.dirs:
            kind = d.entries.get(f"{name}.d")
            if kind is None:
                continue
            if kind[0] == _LINK:
                return None  # chase_symlinks_and_opendir follows it: not ported
            if kind[0] != _OTHER:
                continue  # a file named NAME.d: opendir fails, ignored
            real = os.path.realpath(self.root + d.path)  # path_strv_resolve_uniq: /lib = /usr/lib
            if real in seen_dirs:
                continue
            seen_dirs.add(real)
            try:
                with os.scandir(f"{self.root}{d.path}/{name}.d") as it:
                    for e in it:
                        if e.name.endswith(".conf") and not hidden_or_backup(e.name):
                            if not e.is_file(follow_symlinks=False):
                                return None
                            chosen.setdefault(e.name, e.path)
            except NotADirectoryError:
                continue
            except OSError:
                return None
        out = []
        for conf in sorted(chosen, key=os.fsencode):  # conf-files.c: base_cmp
            try:
                with open(chosen[conf], "rb") as fh:
                    out.append(fh.read())  # an empty drop-in is skipped by config_parse anyway
            except OSError:
                return None
        return out

    def _links(self, name: str, unit_dir: str, aliases: list[str]) -> str | None:
        """install.c:unit_file_lookup_state's two calls of find_symlinks_in_scope, for a plain
        name whose unit file is a regular file in `unit_dir`: "enabled" or "enabled-runtime"
        (links with a known name), "indirect" (links with any name), "" (neither), None where
        the port stops (a same-name link: linked, linked-runtime)."""
        known = {name, *aliases}  # is_symlink_with_known_name
        for match_name in (True, False):
            found = self._in_scope(name, unit_dir, known, match_name)
            if found is None or found:
                return found if match_name or not found else "indirect"
        return ""

    def _in_scope(self, name: str, unit_dir: str, known: set[str], match_name: bool) -> str | None:
        """install.c:find_symlinks_in_scope: links found in /etc/systemd/system make the unit
        enabled at once; links anywhere under /run, enabled-runtime; links elsewhere (vendor,
        control, attached directories) count for instances only, so not here."""
        enabled_in_runtime = same_name = False
        ignore_same_name = False
        for d in self.dirs:
            found, same = self._find_symlinks(d, name, known, match_name, ignore_same_name)
            runtime = d.path == "/run" or d.path.startswith("/run/")  # path_is_runtime
            if found:
                if d.path == PERSISTENT_CONFIG:
                    return "enabled"
                enabled_in_runtime = enabled_in_runtime or runtime
            elif same and (d.path == PERSISTENT_CONFIG or runtime):
                same_name = True
            if not ignore_same_name and (unit_dir == d.path or unit_dir.startswith(d.path + "/")):
                ignore_same_name = True  # the directories after the unit file's own
        if enabled_in_runtime:
            return "enabled-runtime"
        return None if same_name else ""

    @staticmethod
    def _find_symlinks(d: _Dir, name: str, known: set[str], match_name: bool,
                       ignore_same_name: bool) -> tuple[bool, bool]:
        """install.c:find_symlinks for one directory: (found, same-name link seen). In *.wants/
        and *.requires/ a link counts by its name alone (a plain name is never a template's);
        at the top level a link counts if it points to something of this name and its own name
        is known (match_name), or at all (not match_name)."""
        if name in d.wants:
            return True, False
        same_name = False
        for link, dest in d.links:
            found_dest = dest == name
            found_path = not ignore_same_name and link == name
            if found_path and found_dest:
                same_name = True
            elif (found_path or found_dest) and (not match_name or link in known):
                return True, same_name
        return False, same_name
