"""Mounts: mounted from the right source with the right type and options, enough free
space and inodes, writable — and a filesystem that stops answering never hangs reconcile.

Which mount a path reaches is the kernel's answer: the mount id of the resolved path
(an O_PATH descriptor's mnt_id), matched with the /proc/self/mountinfo line of that id, never the last line that
names the path (mount --move, move-beneath and an overmounted parent make that wrong). That,
and everything else that asks the filesystem (realpath, statvfs, the write probe, resolving
UUID=/LABEL= sources), runs in one child process per mount, polled to a deadline. A child
that misses it is abandoned, not waited for: a process in D-state can be neither killed nor
reaped (Python's `subprocess.run(timeout=)` would wait for it without bound). This process
never touches a suspect path itself.

A declared path that is a symlink means what mount(8) makes of it: the directory it resolves
to (realpath). reconcile compares and mounts there, and reports both names.

reconcile mounts what is declared and not mounted (from /etc/fstab, or from the declared
source and type); it never unmounts: a mount from the wrong device, too little space or a
read-only filesystem is `blocked`, for a person to look at.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...core.contract import (
    Action,
    ApplyError,
    Context,
    Drift,
    ObserveError,
    Plan,
    Reconciler,
    Resource,
    run_action,
)
from ...core.values import dotted, format_bytes, format_duration, never_answers, parse_duration, parse_size_or_percent
from .observed import MountInfo, MountObserved, ResolvedSource, observed_from
from .options import holds, tmpfs_shown
from .probe import PROBE_PREFIX, probe_mount
from .tables import norm_path, unescape

if TYPE_CHECKING:
    from ...core.host import Host

MOUNTINFO = "/proc/self/mountinfo"
FSTAB = "/etc/fstab"
DEFAULT_PROBE_TIMEOUT = 5.0
MOUNT_TIMEOUT = 60.0


def parse_count_or_percent(value: int | str) -> tuple[str, float]:
    """min_free_inodes: a count, or a percentage of all inodes."""
    if isinstance(value, str) and value.strip().endswith("%"):
        kind, pct = parse_size_or_percent(value)
        return (kind, pct)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(value)
    return ("count", value)


def same_source(declared: ResolvedSource | None, declared_text: str, have_text: str,
                have: ResolvedSource | None, have_devno: str | None = None) -> bool:
    """Whether a declared source names the same thing as an observed one: the same text, the
    same device after following links (/dev/disk/by-uuid/... -> /dev/nvme1n1), or the same
    device number as the mounted filesystem."""
    if declared_text == have_text:
        return True
    if declared is None:
        return False
    if declared.path and have and declared.path == have.path:
        return True
    have_devnos = {have_devno, have.devno if have else None} - {None}
    return bool(declared.devno) and declared.devno in have_devnos


def _read_lines(said: bytes) -> tuple[str, dict | None]:
    """What a probe child wrote: the last step it began, and its answer (None if it gave none)."""
    step, answer = "", None
    for line in said.split(b"\n"):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict):
            step = msg.get("step", step)
            answer = msg.get("answer", answer)
    return step, answer


def _src(m: MountInfo) -> str:
    return m.source if m.source else "an empty source"


def _missing_options(spec: dict, observed: MountObserved) -> list[str]:
    m = observed.mount
    return [o for o in spec.get("options") or () if holds(o, m, observed.ram_pages, observed.page_size) is False]


def _explain_option(opt: str, observed: MountObserved) -> str:
    m = observed.mount
    model = tmpfs_shown(opt, observed.ram_pages, observed.page_size) if m.fstype == "tmpfs" else None
    if model is not None:
        key, want = model
        shown = [o for o in m.super_options if o.partition("=")[0] == key]
        return (f"{opt} (the kernel would show {f'{key}={want}' if want else f'no {key}= (the default)'}, "
                f"it shows {shown[-1] if shown else f'no {key}= (the default)'})")
    return opt


# --- the reconciler -----------------------------------------------------------------------

def _want_free(rule: tuple[str, float], total: int) -> int:
    kind, value = rule
    return math.ceil(total * value / 100) if kind == "percent" else int(value)


# Filesystems whose statfs reports 0 blocks when they have no size limit: tmpfs mounted with
# size=0 (mm/shmem.c shmem_statfs fills f_blocks only `if (sbinfo->max_blocks)`), and ramfs
# (simple_statfs: never a size). Such a filesystem is not full: it grows until memory runs out.
_UNLIMITED_WHEN_0_BLOCKS = frozenset({"tmpfs", "ramfs"})


def unlimited(observed: MountObserved) -> bool:
    """Whether the mounted filesystem has no size limit (statfs: 0 blocks on tmpfs size=0, ramfs)."""
    s, m = observed.space, observed.mount
    return bool(s and m and s.total_bytes == 0 and m.fstype in _UNLIMITED_WHEN_0_BLOCKS)


def _pct(part: int, total: int) -> str:
    return f"{100 * part / total:.1f}%" if total else "n/a"


def _rule_text(rule: tuple[str, float], want: int, unit: str) -> str:
    kind, value = rule
    amount = format_bytes(want) if unit == "bytes" else f"{want} inodes"
    return f"{value:g}% ({amount})" if kind == "percent" else amount


def _declared_source_text(spec: dict, obs: MountObserved) -> str:
    src = spec["source"]
    res = obs.resolved_source(src)
    if res and res.path and res.path != src:
        return f"{src} ({res.path})"
    if res and res.note:
        return f"{src} ({res.note})"
    return src


class MountsReconciler(Reconciler):
    key = "mounts"
    kind = "mount"
    rank = 30
    volatile_drift = ("min_free", "min_free_inodes")  # free space moves by itself
    forks_to_observe = True  # statvfs and the write probe run in forked children

    def resources(self, section: dict[str, Any]) -> list[Resource]:
        out = []
        for name, raw in section.items():
            spec = {k: v for k, v in raw.items() if k != "needs"}
            spec["path"] = norm_path(name)
            spec.setdefault("mounted", True)
            if "options" in spec:
                # The kernel's escaped form (`lowerdir=/a\040b`, as /proc/self/mountinfo shows it)
                # and the plain one (`lowerdir=/a b`) mean the same option: compared, and passed
                # to mount -o, decoded.
                spec["options"] = tuple(unescape(o) for o in spec["options"])
            if "min_free" in spec:
                spec["min_free"] = parse_size_or_percent(spec["min_free"])
            if "min_free_inodes" in spec:
                spec["min_free_inodes"] = parse_count_or_percent(spec["min_free_inodes"])
            spec["probe_timeout"] = parse_duration(spec.get("probe_timeout", DEFAULT_PROBE_TIMEOUT))
            out.append(Resource(id=f"mount:{spec['path']}", kind=self.kind, name=name, spec=spec,
                                needs=tuple(raw.get("needs", ()))))
        return out

    def canonical_name(self, name: str) -> str:
        # One mount point, however many slashes: systemd's unit for `/tmp/` is tmp.mount, as for
        # `/tmp` (systemd-escape --path; path_simplify), and libmount matches fstab targets the
        # same way (streq_paths). The id is the path as reconcile keys it.
        return norm_path(name)

    def problems(self, section: Any) -> list[tuple[tuple, str]]:
        out = never_answers((((name,), spec) for name, spec in section.items()), "probe_timeout")
        first: dict[str, str] = {}
        for name in section:
            path = norm_path(name)
            if path in first:
                out.append(((name,), f"{dotted((name,))}: the same mount point as {json.dumps(first[path])} "
                                     f"above (a path with trailing or repeated slashes is one mount point: "
                                     f"mount:{path}); declare it once"))
            else:
                first[path] = name
        return out

    # --- observe ------------------------------------------------------------------------

    def observe(self, host: Host, resources: Sequence[Resource]) -> dict[str, Any]:
        if not resources:
            return {}
        requests = {r.id: {"path": r.spec["path"], "mounted": r.spec.get("mounted", True),
                           "writable": r.spec.get("writable") is True, "source": r.spec.get("source"),
                           "fstab": FSTAB, "mountinfo": MOUNTINFO, "prefix": PROBE_PREFIX}
                    for r in resources}
        answers = self._ask_children(host, requests, {r.id: float(r.spec["probe_timeout"]) for r in resources})
        out: dict[str, Any] = {}
        for r in resources:
            ans = answers[r.id]
            if isinstance(ans, ObserveError):
                out[r.id] = ans
            elif ans.get("error"):
                out[r.id] = ObserveError(ans["error"])
            else:
                out[r.id] = observed_from(r.spec["path"], ans)
        return out

    def _ask_children(self, host: Host, requests: dict[str, dict[str, Any]],
                      timeouts: dict[str, float]) -> dict[str, Any]:
        """Start one child per request, all at once, and collect each answer until its own
        deadline; a child that misses it is killed and abandoned (Host.collect)."""
        children = {}
        answers: dict[str, Any] = {}
        for rid, req in requests.items():
            try:
                # Each deadline runs from that child's own start: forking a hundred children
                # of a large process on a busy host takes a while, and must not eat the last
                # ones' time.
                children[rid] = (host.fork_call(probe_mount, req), time.monotonic() + timeouts[rid])
            except OSError as exc:
                answers[rid] = ObserveError(f"cannot start the probe of {req['path']}: {exc.strerror}")
        for rid, (said, finished) in host.collect(children).items():
            req, proc = requests[rid], children[rid][0]
            step, answer = _read_lines(said)
            if not finished:
                what = step or f"the probe of {req['path']}"
                answers[rid] = ObserveError(
                    f"stuck: {what} did not return within {format_duration(timeouts[rid])} "
                    f"(the filesystem does not answer; probe pid {proc.pid} abandoned)")
            elif answer is None:
                text = said.decode(errors="replace").strip()
                answers[rid] = ObserveError(f"the probe of {req['path']} failed "
                                            f"(exit {proc.returncode}): {text[-200:] or 'no output'}")
            else:
                answers[rid] = answer
        return answers

    # --- diff -----------------------------------------------------------------------------

    def diff(self, resource: Resource, observed: MountObserved) -> list[Drift]:
        spec, m = resource.spec, observed.mount
        if not spec.get("mounted", True):
            return [Drift("mounted", False, True)] if m else []
        if m is None:
            return [Drift("mounted", True, False)]
        drift = []
        src = spec.get("source")
        if src and not same_source(observed.resolved_source(src), src, m.source, observed.resolved_source(m.source),
                                   m.devno):
            drift.append(Drift("source", _declared_source_text(spec, observed), m.source))
        if spec.get("fstype") and spec["fstype"] != m.fstype:
            drift.append(Drift("fstype", spec["fstype"], m.fstype))
        want_opts = spec.get("options") or ()
        if _missing_options(spec, observed):
            drift.append(Drift("options", ",".join(want_opts), ",".join(m.all_options)))
        space = observed.space
        if space and spec.get("min_free") and not unlimited(observed):
            want = _want_free(spec["min_free"], space.total_bytes)
            if space.total_bytes == 0:
                # statfs gave no size at all (a FUSE filesystem without statfs, a pseudo filesystem):
                # free space is unknown, not zero.
                drift.append(Drift("min_free", "≥ " + _rule_text(spec["min_free"], want, "bytes"),
                                   "unknown (statfs reports no size: 0 blocks)"))
            elif space.free_bytes < want:
                have = (f"{format_bytes(space.free_bytes)} free ({_pct(space.free_bytes, space.total_bytes)} "
                        f"of {format_bytes(space.total_bytes)})")
                drift.append(Drift("min_free", "≥ " + _rule_text(spec["min_free"], want, "bytes"), have))
        # A filesystem without a fixed inode table (btrfs, many FUSE ones) reports f_files = 0.
        if space and spec.get("min_free_inodes") and space.total_inodes:
            want = _want_free(spec["min_free_inodes"], space.total_inodes)
            if space.free_inodes < want:
                drift.append(Drift("min_free_inodes", "≥ " + _rule_text(spec["min_free_inodes"], want, "inodes"),
                                   f"{space.free_inodes} free ({_pct(space.free_inodes, space.total_inodes)} "
                                   f"of {space.total_inodes})"))
        want_w = spec.get("writable")
        if want_w is True and (m.read_only or observed.writable is False):
            drift.append(Drift("writable", True, False))
        elif want_w is False and not m.read_only:
            drift.append(Drift("writable", False, True))
        return drift

    # --- plan -----------------------------------------------------------------------------

    def plan(self, resource: Resource, observed: MountObserved, drift: Sequence[Drift], ctx: Context) -> Plan:
        if not drift:
            return Plan()
        spec, m, path = resource.spec, observed.mount, resource.spec["path"]
        fields = {d.field: d for d in drift}
        if "mounted" in fields:
            if not fields["mounted"].want:
                return Plan(blocked=f"{observed.where()} is mounted ({m.fstype} from {_src(m)}) but declared "
                                    f"`mounted: false`; reconcile never unmounts: unmount it by hand (umount {path})")
            return self._plan_mount(spec, observed)

        blocked = []
        never = "reconcile never unmounts a filesystem that may hold user data"
        if "source" in fields:
            blocked.append(f"{path} is mounted from {_src(m)}, not {fields['source'].want}; {never}")
        if "fstype" in fields:
            blocked.append(f"{path} is {m.fstype}, not {spec['fstype']}; {never}")
        if "options" in fields:
            missing = _missing_options(spec, observed)
            shown = [o for o in missing if tmpfs_shown(o, observed.ram_pages, observed.page_size) is None
                     or m.fstype != "tmpfs"]
            hint = (f"; the kernel shows {m.fstype}'s options in its own form (findmnt -no VFS-OPTIONS,FS-OPTIONS "
                    f"{path}): if {', '.join(shown)} is in effect under another spelling, declare that spelling"
                    if shown else "")
            blocked.append(f"{path} lacks mount option{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(_explain_option(o, observed) for o in missing)}: remount by hand "
                           f"(mount -o remount,{','.join(missing)} {path}) and fix /etc/fstab{hint}")
        space = observed.space
        if "min_free" in fields and space and space.total_bytes == 0:
            blocked.append(f"{path} ({m.fstype}) reports no size (statfs: 0 blocks), so its free space cannot be "
                           f"judged against min_free; remove min_free for it, or check it by other means")
        elif "min_free" in fields and space:
            want = _want_free(spec["min_free"], space.total_bytes)
            blocked.append(f"{path} has {format_bytes(space.free_bytes)} free, wants "
                           f"{_rule_text(spec['min_free'], want, 'bytes')}: free at least "
                           f"{format_bytes(want - space.free_bytes)} (or grow the filesystem)")
        if "min_free_inodes" in fields and space:
            want = _want_free(spec["min_free_inodes"], space.total_inodes)
            blocked.append(f"{path} has {space.free_inodes} free inodes, wants "
                           f"{_rule_text(spec['min_free_inodes'], want, 'inodes')}: remove at least "
                           f"{want - space.free_inodes} files")
        if "writable" in fields:
            if spec.get("writable") is False:
                blocked.append(f"{path} is mounted read-write but declared `writable: false`: "
                               f"remount it read-only by hand (mount -o remount,ro {path})")
            elif m.read_only:
                blocked.append(f"{path} is mounted read-only but must be writable (the kernel may have "
                               f"remounted it after I/O errors: check dmesg before mount -o remount,rw {path})")
            else:
                blocked.append(f"{path} is mounted read-write but the write probe failed: {observed.write_error}")
        return Plan(blocked="; ".join(blocked) or None)

    def _plan_mount(self, spec: dict, observed: MountObserved) -> Plan:
        path, fst = spec["path"], observed.fstab
        src, fstype, options = spec.get("source"), spec.get("fstype"), spec.get("options") or ()
        where = observed.where()
        if observed.hidden:
            # Something is mounted at the path but cannot be reached: a later mount on an
            # ancestor covers it. Mounting again would put a second copy on top of the cover.
            h, on = observed.hidden[-1], observed.on
            cover = f" by mount {on.mount_id} on {on.mount_point} ({on.fstype} from {_src(on)})" if on else ""
            return Plan(blocked=f"{where} is not reachable: mount {h.mount_id} there ({h.fstype} from {_src(h)}) is "
                                f"hidden{cover}, mounted over its parent later; reconcile does not mount {path} "
                                f"a second time: unmount what covers it (findmnt -o ID,PARENT,TARGET,SOURCE)")
        if not observed.exists and not (fst and any(o == "X-mount.mkdir" or o.startswith("X-mount.mkdir=")
                                                    for o in fst.options)):
            return Plan(blocked=f"{where} does not exist: reconcile does not create mount points; create it "
                                f"(mkdir -p {observed.resolved or path}) or give the {FSTAB} entry X-mount.mkdir")
        if fst:
            conflicts = []
            if src and not same_source(observed.resolved_source(src), src, fst.source,
                                       observed.resolved_source(fst.source)):
                conflicts.append(f"source {fst.source}, the state file {_declared_source_text(spec, observed)}")
            if fstype and fstype != fst.fstype:
                conflicts.append(f"type {fst.fstype}, the state file {fstype}")
            if conflicts:
                return Plan(blocked=f"{path} is not mounted and {FSTAB} line {fst.line} disagrees with the state "
                                    f"file ({'; '.join(conflicts)}): fix one of them")
            return Plan(actions=(Action("mount", path, f"mount {path} ({FSTAB} line {fst.line}: {fst.source}, "
                                                       f"{fst.fstype})", {"fstab": True}),))
        if src and fstype:
            opts = f" -o {','.join(options)}" if options else ""
            return Plan(actions=(Action("mount", path, f"mount -t {fstype}{opts} {src} {path}",
                                        {"source": src, "fstype": fstype, "options": list(options)}),))
        broken = (f" ({FSTAB} line{'s' if len(observed.fstab_errors) > 1 else ''} "
                  f"{', '.join(map(str, observed.fstab_errors))} cannot be parsed and mount(8) ignores "
                  f"{'them' if len(observed.fstab_errors) > 1 else 'it'})" if observed.fstab_errors else "")
        return Plan(blocked=f"{where} is not mounted, has no {FSTAB} entry{broken}, and the state file does not "
                            f"give both `source` and `fstype` to mount it from")

    # --- apply ----------------------------------------------------------------------------

    def apply(self, host: Host, resource: Resource, action: Action) -> str:
        if action.action != "mount":
            raise ApplyError(f"unknown mount action {action.action!r}")
        # Look again right before mounting: another resource of this run (`/data` and `/data/`,
        # or a symlink to it) or someone else may have mounted it since it was observed, and
        # mount(8) would stack a second mount on top (it refuses only a block device already
        # mounted on the same point).
        rid, path = resource.id, resource.spec["path"]
        req = {"path": path, "mounted": False, "fstab": FSTAB, "mountinfo": MOUNTINFO}
        now = self._ask_children(host, {rid: req}, {rid: float(resource.spec["probe_timeout"])})[rid]
        if isinstance(now, ObserveError):
            raise ApplyError(f"not mounted: {now}")
        if now.get("error"):
            raise ApplyError(f"not mounted: {now['error']}")
        if now.get("mount"):
            m = observed_from(path, now).mount
            return f"{path} is already mounted ({m.fstype} from {_src(m)}, mount {m.mount_id}): not mounted again"
        p = action.params
        if p.get("fstab"):
            argv = ["mount", "--target", action.target]
        else:
            argv = ["mount", "-t", p["fstype"]]
            if p.get("options"):
                argv += ["-o", ",".join(p["options"])]
            argv += ["--source", p["source"], "--target", action.target]
        return run_action(host, argv, MOUNT_TIMEOUT)

    def summary(self, resource: Resource, observed: MountObserved) -> str:
        m = observed.mount
        link = f" (-> {observed.resolved})" if observed.resolved and observed.resolved != observed.path else ""
        if m is None:
            if not observed.exists:
                return f"not mounted: {observed.path}{link} does not exist"
            if observed.hidden:
                return f"not mounted: the mount at {observed.path}{link} is hidden under another"
            return f"not mounted{link}" + (f" ({FSTAB}: {observed.fstab.source})" if observed.fstab else "")
        parts = [f"{m.fstype} from {_src(m)}" + (f" [{m.root}]" if m.root != "/" else "") + link]
        if observed.hidden:
            parts.append(f"{len(observed.hidden)} more mount{'s' if len(observed.hidden) > 1 else ''} underneath")
        s = observed.space
        if unlimited(observed):
            parts.append(f"no size limit ({m.fstype}: bounded only by memory)")
        elif s and s.total_bytes:
            parts.append(f"{format_bytes(s.free_bytes)} free of {format_bytes(s.total_bytes)} "
                         f"({_pct(s.free_bytes, s.total_bytes)})")
        parts.append("ro" if m.read_only else "rw" + (", write probe ok" if observed.writable else ""))
        return ", ".join(parts)
