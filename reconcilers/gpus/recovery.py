"""Recovery as declared state (`gpus.recover`): carrying out the step of a GPU's verdict, within caps.

Opt-in: without `recover` nothing here runs, and reconcile only names the step (health.py).

- A GPU whose step is a reset (pending row remap or retired pages, volatile uncorrected ECC, the
  driver's RESET_GPU / DRAIN_AND_RESET) is freed first as `free_with` frees memory (memory.free_holder;
  a holder `allow`ed blocks the reset, named), then reset with `nvidia-smi --gpu-reset -i BUS_ID`
  (NVML has no public reset call), and observed again by the engine. nvidia-smi's own words
  ("GPU … was successfully reset.") go to the kernel log, as `nvidia-smi -r | tee /dev/kmsg` would:
  the kernel-log reader (xid.py) then takes the Xids before them as history. On NVSwitch systems the
  GPUs are reset only together, with the fabric manager's involvement: blocked, saying so.
- A GPU whose step is a reboot (GPU lost / Xid 79, RESTART_BM, a reset in this boot that did not
  help) reboots the node through the init system (`systemctl reboot`), or with `reboot_with: slurm`
  through Slurm's own queue (`scontrol reboot ASAP nextstate=DOWN`: drained, rebooted once its jobs
  end), journaled first (the engine's intent line, with this boot's id); the apply ends there
  (Action.ends_run). A reboot requested in this boot is not requested again (it is pending). The next boot's apply
  (contrib/reconcile-boot.service) completes the record (pipeline/reboots.py).
- Caps, counted from the journal (Context.history; keyed by GPU UUID, this node's journal, boot id):
  a GPU reset `max_resets` times in `window`, or a node rebooted `max_reboots` times, is blocked as
  needing service, with the history: never a further attempt, never a reboot loop (NVSentinel #1543,
  gpud's reboot counting #1075). A replaced GPU (a new UUID at the bus id) starts clean.
  `reconcile ack` (a journal line with who and why) starts a GPU's or the node's count again.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...common import systemd
from ...core.boot import boot_id as _boot_id
from ...core.contract import Action, ApplyError, Context, utc_iso
from ...core.host import CommandTimeout
from ...core.values import format_duration, parse_duration
from .catalogue import step_rank
from .memory import allowed, free_holder, holding
from .observed import Gpu, GpusObserved
from .setters import Setters, unit_action
from .settings import PERSISTENCED
from .xid import KERNEL_LOG_ENV, pci_key

if TYPE_CHECKING:
    from ...core.host import Host

RESET_STEPS = frozenset({"RESET_GPU", "DRAIN_AND_RESET"})
REBOOT_STEPS = frozenset({"RESTART_BM", "SYSTEM_REBOOT"})
DEFAULT_MAX_RESETS = 2
DEFAULT_MAX_REBOOTS = 2
DEFAULT_WINDOW = "24h"
REBOOT_WITH = ("systemctl", "slurm")  # how the node is rebooted (recover.reboot_with)
SLURM_REASON_MAX = 200  # ours, as slurm-health's reasons (doors/sinks/slurm_node.MAX_REASON)
RESET_TIMEOUT = 120.0
REBOOT_TIMEOUT = 60.0
# NVSwitch devices (HGX/DGX): the driver's device files and its /proc entries.
NVSWITCH_GLOBS = ("/dev/nvidia-nvswitch[0-9]*", "/proc/driver/nvidia-nvswitch/devices/*")
NVSWITCH_ENV = "RECONCILE_NVSWITCH_GLOB"  # a glob to look for instead (tests)
KMSG = "/dev/kmsg"
ESCALATION = "escalation: after"  # a reboot planned because a reset of this boot was not enough


def parse_recover(section: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not section:
        return None
    return {"reset": bool(section.get("reset", False)), "reboot": bool(section.get("reboot", False)),
            "max_resets": int(section.get("max_resets", DEFAULT_MAX_RESETS)),
            "reboot_with": str(section.get("reboot_with", "systemctl")),
            "max_reboots": int(section.get("max_reboots", DEFAULT_MAX_REBOOTS)),
            "window": parse_duration(section.get("window", DEFAULT_WINDOW))}


def recover_problems(section: Mapping[str, Any]) -> list[tuple[tuple, str]]:
    """A recovery without a gate that runs after it: the passive verdict alone would return the GPU."""
    rec = section.get("recover")
    if not isinstance(rec, Mapping) or not (rec.get("reset") or rec.get("reboot")):
        return []
    validate = section.get("validate")
    after = validate.get("after", ("boot", "recover")) if isinstance(validate, Mapping) else ()
    if "recover" in after:
        return []
    return [(("recover",), "gpus.recover needs gpus.validate with `after: [recover]` (a command that must pass "
                           "after a reset or reboot): the passive verdict alone never returns a recovered GPU to "
                           "service")]


def slurm_node_name() -> str:
    """What Slurm calls this node: SLURMD_NODENAME (set by slurmd for what it runs, and for a node
    started with `slurmd -N`), else the short host name (slurm.conf's NodeName default); the same
    rule as `reconcile slurm-health`'s (doors/slurm.node_name, less its --node)."""
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".", 1)[0]


def nvswitches() -> tuple[str, ...]:
    patterns = (os.environ[NVSWITCH_ENV],) if os.environ.get(NVSWITCH_ENV) else NVSWITCH_GLOBS
    return tuple(sorted(p for pattern in patterns for p in glob.glob(pattern)))


# --- the history, from the journal -----------------------------------------------------------------

@dataclass(frozen=True)
class Attempt:
    """One reset or reboot reconcile set out to do (its journal intent), and what came of it."""

    action: str  # reset | reboot
    time: float
    boot: str
    target: str  # the GPU's UUID (reset) or "node"
    description: str
    result: str = ""  # done | failed | "" (no result line: killed while it ran, or the host went down)
    run: str = ""
    gpus: tuple[str, ...] = ()  # UUIDs the action was for

    def describe(self) -> str:
        came = {"done": "", "failed": " (failed)"}.get(self.result, " (no result recorded)")
        return f"{utc_iso(self.time)} in boot {self.boot[:8] or '?'}{came}"


@dataclass
class History:
    """What the journal says reconcile did to this node's GPUs in the window, and the acks since."""

    boot: str
    now: float
    attempts: list[Attempt] = field(default_factory=list)  # oldest first
    acks: list[dict[str, Any]] = field(default_factory=list)
    completed: dict[str, str] = field(default_factory=dict)  # reboot run -> the boot it came up in

    @classmethod
    def read(cls, ctx: Context, since: float, boot: str, now: float) -> History | None:
        if ctx.history is None:
            return None
        hist = cls(boot, now)
        by_key: dict[tuple[str, str, str], Attempt] = {}
        for e in reversed(list(ctx.history(since))):  # oldest first
            event = e.get("event")
            if event == "ack":
                hist.acks.append(e)
            elif event == "rebooted":
                hist.completed[str(e.get("intent_run", ""))] = str(e.get("boot", ""))
            elif e.get("resource") == "gpus" and e.get("action") in ("reset", "reboot"):
                key = (str(e.get("run", "")), str(e["action"]), str(e.get("target", "")))
                when = _time(e.get("time")) or 0.0
                if event == "intent":
                    by_key[key] = Attempt(str(e["action"]), when, str(e.get("boot", "")), key[2],
                                          str(e.get("description", "")), run=key[0],
                                          gpus=_uuids(str(e.get("description", "")), key[2]))
                    hist.attempts.append(by_key[key])
                elif event == "result" and key in by_key:
                    old = by_key[key]
                    new = Attempt(old.action, old.time, old.boot, old.target, old.description, str(e.get("result", "")),
                                  old.run, old.gpus)
                    hist.attempts[hist.attempts.index(old)] = by_key[key] = new
        return hist

    def _ack_time(self, gpu: Gpu | None) -> float:
        """When the latest ack that covers GPU (None: the node) was made; 0 when none. A node's ack
        covers every GPU; a GPU's, given by UUID or bus id, only that GPU."""
        latest = 0.0
        for a in self.acks:
            what = str(a.get("gpu") or "")
            if what and (gpu is None or (what != gpu.uuid and pci_key(what) != pci_key(gpu.bus_id))):
                continue
            latest = max(latest, _time(a.get("time")) or 0.0)
        return latest

    def resets(self, gpu: Gpu) -> list[Attempt]:
        since = self._ack_time(gpu)
        return [a for a in self.attempts if a.action == "reset" and a.target == gpu.uuid and a.time > since]

    def reboots(self) -> list[Attempt]:
        since = self._ack_time(None)
        return [a for a in self.attempts if a.action == "reboot" and a.time > since]

    def reboot_pending(self) -> Attempt | None:
        """A reboot requested in this boot and not refused: the node is still up, so it is yet to
        come (`scontrol reboot ASAP` waits for the node's jobs; systemd is taking the node down)."""
        return next((a for a in reversed(self.reboots()) if a.boot == self.boot and a.result == "done"), None)

    def reset_this_boot(self, gpu: Gpu) -> Attempt | None:
        return next((a for a in reversed(self.resets(gpu)) if a.boot == self.boot and a.result != "failed"), None)

    def rebooted_into_this_boot(self) -> Attempt | None:
        """The reboot reconcile requested that led to this boot: made in another boot, and completed in
        this one or not yet completed (this is the first apply since)."""
        for a in reversed([a for a in self.attempts if a.action == "reboot"]):
            if a.boot and a.boot != self.boot and self.completed.get(a.run, self.boot) == self.boot:
                return a
        return None

    def recoveries_this_boot(self) -> list[tuple[str, float]]:
        """(what, when) of each recovery of this boot: the resets done in it, and the reboot into it
        (at the time it was requested: before anything of this boot)."""
        out = [(f"the reset of {a.target} at {utc_iso(a.time)}", a.time) for a in self.attempts
               if a.action == "reset" and a.boot == self.boot and a.result == "done"]
        reboot = self.rebooted_into_this_boot()
        if reboot is not None:
            out.append((f"the reboot requested at {utc_iso(reboot.time)}", reboot.time))
        return out

    def node_ack_after(self, t: float) -> str:
        for a in reversed(self.acks):
            when = _time(a.get("time")) or 0.0
            if not a.get("gpu") and when > t:
                return f"the ack by {a.get('by', '?')} at {a.get('time')} ({a.get('reason', '')})"
        return ""


def _time(text: Any) -> float | None:
    """A journal time (contract.utc_iso: `2026-12-01T09:45:36.666Z`) as epoch seconds; None if not one."""
    import calendar
    import re

    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?Z", text) if isinstance(text, str) else None
    if not m:
        return None
    y, mo, d, h, mi, sec = (int(x) for x in m.groups()[:6])
    try:
        return calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) + (float(m.group(7)) if m.group(7) else 0.0)
    except (ValueError, OverflowError):
        return None


def _uuids(description: str, target: str) -> tuple[str, ...]:
    import re

    return tuple(dict.fromkeys(re.findall(r"GPU-[0-9a-fA-F-]{8,}", f"{target} {description}")))


# --- the plan ------------------------------------------------------------------------------------

@dataclass
class RecoveryPlan:
    actions: list[Action] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    handled: set[int] = field(default_factory=set)  # GPU indices whose verdict this plan speaks for


def top_action(g: Gpu) -> str:
    return max(g.signals, key=lambda s: step_rank(s.action)).action if g.signals else ""


def _history_lines(attempts: Sequence[Attempt]) -> str:
    return "; ".join(a.describe() for a in attempts)


def recovery_plan(spec: Mapping[str, Any], observed: GpusObserved, fields: set[str], ctx: Context,
                  history: History | None) -> RecoveryPlan:
    rec = spec.get("recover")
    out = RecoveryPlan()
    if not rec:
        return out
    window = window_words(rec)
    ack = "`reconcile ack --gpu {uuid} --reason ...` once it was serviced"
    reboot_for: list[tuple[Gpu, str]] = []
    resets: list[tuple[Gpu, str]] = []
    for g in observed.gpus:
        if g.health != "unhealthy" or f"gpu{g.index}.healthy" not in fields:
            continue
        step = top_action(g)
        why = "; ".join(g.problems)
        if step in RESET_STEPS and history is not None and (done := history.reset_this_boot(g)) is not None:
            reboot_for.append((g, f"{ESCALATION} the reset at {utc_iso(done.time)} in this boot, which did not clear "
                                  f"the fault: {why}"))
        elif step in RESET_STEPS:
            resets.append((g, why))
        elif step in REBOOT_STEPS:
            reboot_for.append((g, why))
    if history is None and (resets or reboot_for):
        out.notes.append("recover: no journal to count earlier attempts from: nothing is reset or rebooted")
        return out
    assert history is not None or not (resets or reboot_for)
    if reboot_for and rec["reboot"]:
        out.handled.update(g.index for g, _ in reboot_for)
        labels = ", ".join(f"{g.label} {g.uuid}" for g, _ in reboot_for)
        act, stop = reboot_step(rec, history, labels, " / ".join(f"{g.label}: {w}" for g, w in reboot_for), window,
                                [g.uuid for g, _ in reboot_for])
        out.actions.extend(act)
        out.blocked.extend(stop)
        resets = []  # the reboot resets every GPU
    elif reboot_for:
        out.notes.extend(f"{g.label}: recover.reboot is off: reconcile does not reboot the node" for g, _ in reboot_for)
    if resets and not rec["reset"]:
        out.notes.extend(f"{g.label}: recover.reset is off: reconcile does not reset it" for g, _ in resets)
        return out
    switches = nvswitches() if resets else ()
    seen: tuple[set[str], set[str]] = (set(), set())
    for g, why in resets:
        out.handled.add(g.index)
        assert history is not None
        done = history.resets(g)
        if switches:
            out.blocked.append(f"{g.label} must not run jobs: reset the GPU. Why: {why}. reconcile does not reset it: "
                               f"this host has NVSwitches ({switches[0]}), whose GPUs are reset only together, with "
                               "the fabric manager (stop their work and nvidia-fabricmanager, then `nvidia-smi -r`)")
            continue
        if len(done) >= rec["max_resets"]:
            out.blocked.append(f"{g.label} {g.uuid} must not run jobs, and needs service: reset {len(done)} time(s) in "
                               f"{window} (max_resets {rec['max_resets']}): {_history_lines(done)}; no further "
                               f"reset. Why: {why}; " + ack.format(uuid=g.uuid))
            continue
        held = [h for h in observed.holders if any(u.gpu == g.index for u in h.uses)]
        mine = [h for h in held if allowed(h, spec.get("allow", ()))]
        blocked: list[str] = []
        acts: list[Action] = []
        if mine:
            blocked.append(f"{g.label} must not run jobs: reset the GPU. Why: {why}. It cannot be reset while "
                           + ", ".join(f"{h.label()} {holding(h, [g.index])}" for h in mine)
                           + " holds it (in gpus.allow): stop it, or take it out of allow")
        for h in held:
            if h not in mine:
                free_holder(h, [g.index], spec.get("free_with") or {}, ctx, seen, acts, out.notes, blocked)
        if blocked:
            out.blocked.extend(blocked if mine else [f"{g.label} must not run jobs: reset the GPU (once it is free). "
                                                     f"Why: {why}", *blocked])
            continue
        out.actions.extend(a for a in acts if (a.action, a.target) not in {(b.action, b.target) for b in out.actions})
        how, around = persistence_around(g, observed)
        out.actions.append(Action("reset", g.uuid, f"reset {g.label} {g.uuid} (nvidia-smi --gpu-reset{around}): {why}",
                                  {"bus": g.bus_id, "index": g.index, "uuid": g.uuid, "persistence": how}))
    # The reboot, when there is one, is the last thing done.
    out.actions.sort(key=lambda a: a.ends_run)
    return out


def reboot_step(rec: Mapping[str, Any], history: History | None, labels: str, why: str, window: str,
                uuids: Sequence[str]) -> tuple[list[Action], list[str]]:
    """([the reboot], []) or ([], [why not]): waiting for the reboot already requested in this boot, or
    `max_reboots` reached (the node needs a person, with the history). WHY starting with ESCALATION
    (a reset in this boot that did not clear the fault, or the gate that failed after it) is
    journaled so: the intent's and the result's description say `escalation: after the reset at …`."""
    reboots = history.reboots() if history else []
    pending = history.reboot_pending() if history else None
    if pending is not None:
        return [], [f"{labels} must not run jobs: waiting for the reboot requested at {utc_iso(pending.time)} in "
                    f"this boot ({pending.description.split(' for ')[0]}); not requested again"]
    if len(reboots) >= rec["max_reboots"]:
        return [], [f"{labels} must not run jobs, and the node needs service: reconcile rebooted it {len(reboots)} "
                    f"time(s) in {window} (max_reboots {rec['max_reboots']}): {_history_lines(reboots)}; no further "
                    f"reboot. Why: {why}; `reconcile ack --reason ...` once it was serviced"]
    params: dict[str, Any] = {"gpus": list(uuids)}
    how = "systemctl reboot"
    if rec["reboot_with"] == "slurm":
        params.update(via="slurm", node=slurm_node_name(), reason=slurm_reason(f"gpus: {labels}: {why}"))
        how = f"through Slurm: scontrol reboot ASAP nextstate=DOWN {params['node']}"
    return [Action("reboot", "node", f"reboot the node ({how}) for {labels}: {why}", params, ends_run=True)], []


def window_words(rec: Mapping[str, Any]) -> str:
    return f"{int(rec['window'] // 3600)}h" if rec["window"] % 3600 == 0 else format_duration(rec["window"])


def gate_escalation(rec: Mapping[str, Any] | None, failed: str, failed_at: float,
                    history: History | None) -> tuple[list[Action], list[str]] | None:
    """The next step after a validation gate that failed after a reset done in this boot, when
    `recover.reboot` allows it: the reboot, within `max_reboots` (reboot_step), as NVSentinel and
    medik8s escalate (reset, then reboot, then a person). None where it does not apply: no reboot
    declared, no history, or the failed run did not follow a reset of this boot (after this boot's
    start or the reboot into it, the next step is a person: blocked with the gate's tail)."""
    if not rec or not rec.get("reboot") or history is None:
        return None
    done = [a for a in history.attempts if a.action == "reset" and a.boot == history.boot and a.result == "done"
            and a.time <= failed_at]
    if not done:
        return None
    last = done[-1]
    uuids = list(dict.fromkeys(u for a in done for u in (a.gpus or (a.target,))))
    why = f"{ESCALATION} the reset at {utc_iso(last.time)} in this boot, the validation gate {failed}"
    return reboot_step(rec, history, ", ".join(uuids), why, window_words(rec), uuids)


def persistence_around(g: Gpu, observed: GpusObserved) -> tuple[str, str]:
    """How persistence mode is turned off for a reset and back on after ("unit", "nvml" or "" when it
    is off), and the words for the plan. The driver refuses a reset while persistence mode is on ("In
    use by another client": it counts as a client of the device; NVIDIA's nvidia-smi(1) `-r`,
    NVIDIA/NVSentinel#1690, whose reset turns it off first). Where nvidia-persistenced.service runs,
    persistence mode is the daemon's: it is stopped (every GPU's persistence mode goes off) and started
    again (settings.py sets persistence through it too); else through NVML's setter, on this GPU only."""
    if not g.persistence_mode:
        return "", ""
    unit = observed.recovery.persistenced if observed.recovery is not None else None
    if unit is not None and unit.active:
        return "unit", f"; persistence mode off for it by stopping {PERSISTENCED}, started again after"
    return "nvml", "; persistence mode off for it through NVML, on again after"


# --- carrying it out -----------------------------------------------------------------------------

RESET_HINTS = {"in use": "a process still holds it, or persistence mode does (nvidia-persistenced, DCGM, a "
                         "monitoring agent?)",
               "is lost": "the GPU is lost: reboot the node",
               "insufficient permissions": "resetting a GPU needs root",
               "not supported": "this GPU or platform does not support a reset on its own"}


def reset(host: Host, params: Mapping[str, Any], setters: Setters | None = None) -> str:
    """Persistence mode off (when it is on), the reset, persistence mode as it was: what happened to
    persistence mode is said in the result (the journal's result line)."""
    how, index = str(params.get("persistence") or ""), params.get("index", "?")
    if not how:
        return _reset(host, params)
    setters = setters or Setters()
    bus = str(params["bus"])
    step = (f"reset the GPU by hand: `systemctl stop {PERSISTENCED}` (or `nvidia-smi -pm 0 -i {bus}`), "
            f"`nvidia-smi --gpu-reset -i {bus}`, then persistence mode on again")
    try:
        off = _persistence(host, setters, params, how, on=False)
    except ApplyError as exc:
        raise ApplyError(f"GPU {index}: not reset: persistence mode is on and could not be turned off ({exc}); "
                         f"{step}") from None
    failed: ApplyError | None = None
    try:
        said = _reset(host, params)
    except ApplyError as exc:
        failed, said = exc, str(exc)
    try:
        back = _persistence(host, setters, params, how, on=True)
    except ApplyError as exc:
        back = f"persistence mode NOT on again ({exc}): it is off until it is set (gpus.settings, or by hand)"
    said = f"{said}; persistence mode was on: {off}, then {back}"
    if failed is not None:
        raise ApplyError(said, independent=failed.independent) from None
    return said


def _persistence(host: Host, setters: Setters, params: Mapping[str, Any], how: str, on: bool) -> str:
    if how == "unit":
        unit_action(host, Action("start" if on else "stop", PERSISTENCED))  # ApplyError when systemd refuses
        return f"{'started' if on else 'stopped'} {PERSISTENCED}"
    gpu = params.get("index")
    return setters.set(host, Action("set", f"gpu{gpu}.persistence_mode", "",
                                    {"gpu": gpu, "uuid": params.get("uuid"), "setting": "persistence_mode",
                                     "value": on}))


def _reset(host: Host, params: Mapping[str, Any]) -> str:
    bus, index = str(params["bus"]), params.get("index", "?")
    argv = ["nvidia-smi", "--gpu-reset", "-i", bus]
    try:
        res = host.run(argv, timeout=RESET_TIMEOUT)
    except CommandTimeout as exc:
        raise ApplyError(f"GPU {index}: {exc} (a wedged driver?)") from None
    said = " ".join(line.strip() for line in (res.stdout + "\n" + res.stderr).splitlines() if line.strip())
    if not res.ok or "successfully reset" not in said:
        low = said.lower()
        hint = next((h for words, h in RESET_HINTS.items() if words in low), "")
        raise ApplyError(f"GPU {index}: `{' '.join(argv)}` exited {res.returncode}: {said[:400] or 'no output'}"
                         + (f" ({hint})" if hint else ""))
    line = next((s for s in (res.stdout + res.stderr).splitlines() if "successfully reset" in s), said).strip()
    return line + mark_kernel_log(line)


def mark_kernel_log(line: str) -> str:
    """nvidia-smi's words into the kernel log, as `nvidia-smi -r | tee /dev/kmsg` would: the driver
    prints nothing of its own at a reset, and the kernel-log reader takes the Xids before this line
    as history (xid.py). "" when written, else why not (the Xids before it then still count)."""
    target = os.environ.get(KERNEL_LOG_ENV) or KMSG
    try:
        with open(target, "a" if target != KMSG else "w", encoding="utf-8") as fh:
            fh.write(f"reconcile: {line}\n")
        return ""
    except OSError as exc:
        return f"; not written to the kernel log ({target}: {exc.strerror}): its Xids before the reset still count"


def slurm_reason(what: str) -> str:
    """`reconcile: WHAT`, one line, bounded: the prefix is the ownership mark slurm-health resumes by
    (doors/sinks/slurm_node.OWNER); Slurm stores a reason as given, newlines included."""
    import re

    flat = re.sub(r"\s+", " ", f"reconcile: {what}").strip()
    return flat if len(flat) <= SLURM_REASON_MAX else flat[: SLURM_REASON_MAX - 3].rstrip() + "..."


def reboot(host: Host, params: Mapping[str, Any]) -> str:
    if params.get("via") == "slurm":
        return reboot_through_slurm(host, params)
    said = systemd.reboot(host, REBOOT_TIMEOUT)
    return "reboot requested (systemctl reboot)" + (f": {said}" if said else "")


def reboot_through_slurm(host: Host, params: Mapping[str, Any]) -> str:
    """`scontrol reboot ASAP nextstate=DOWN reason=… NODE` (scontrol(1)): Slurm drains the node (no new
    jobs), waits for its jobs to end, then runs slurm.conf's RebootProgram. `nextstate=DOWN`, not
    RESUME: the node comes back out of service with reconcile's reason, and `reconcile slurm-health`
    resumes it only once the validation gate passed in the new boot; RESUME would hand
    it to jobs before the gate."""
    node = str(params["node"])
    argv = ["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={params['reason']}", node]
    try:
        res = host.run(argv, timeout=REBOOT_TIMEOUT)
    except CommandTimeout as exc:
        raise ApplyError(f"{exc} (slurmctld not answering?)") from None
    said = " ".join(line.strip() for line in (res.stdout + "\n" + res.stderr).splitlines() if line.strip())
    if not res.ok:
        raise ApplyError(f"`scontrol reboot ASAP nextstate=DOWN … {node}` exited {res.returncode}: "
                         f"{said[:400] or 'no output'}")
    return (f"reboot requested through Slurm (scontrol reboot ASAP nextstate=DOWN {node}): Slurm drains the "
            "node, waits for its jobs, then runs its RebootProgram" + (f": {said}" if said else ""))


def boot_id() -> str:
    """This boot's id; "" where it cannot be read (core/boot.py)."""
    return _boot_id() or ""
