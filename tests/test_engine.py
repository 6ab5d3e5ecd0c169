"""The engine's rules, on an in-memory world: ordering, needs, passes, verification, statuses,
exit codes and the journal. The "toy" kind below is a complete reconciler whose host is a dict,
so these rules are tested without touching a machine."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import pytest
from host_doubles import ScriptedHost
from reconcile_host.core.contract import Action, ApplyError, Drift, ObserveError, Plan, Reconciler, Resource
from reconcile_host.pipeline.engine import ActionLog, Engine
from reconcile_host.pipeline.statefile import LoadedState, order_resources
from reconcile_host.reconcilers import KINDS, Kind

WORLD: dict = {}


@dataclass(frozen=True)
class ToyObserved:
    level: int


class ToyReconciler(Reconciler):
    """A counter per resource that apply raises one step at a time (so it can need several
    passes), with knobs for failing, never moving, being unobservable or running on its own."""

    key, kind, rank = "toys", "toy", 5

    def resources(self, section):
        raise NotImplementedError  # built directly by the tests

    def observe(self, host, resources):
        WORLD.setdefault("observed", []).append([r.id for r in resources])
        out = {}
        for r in resources:
            if r.spec.get("unobservable"):
                out[r.id] = ObserveError("cannot see it")
            else:
                out[r.id] = ToyObserved(WORLD.get(r.name, 0))
        return out

    def diff(self, resource, observed):
        want = resource.spec["want"]
        return [] if observed.level == want else [Drift("level", want, observed.level)]

    def plan(self, resource, observed, drift, ctx):
        if not drift:
            return Plan()
        if resource.spec.get("running"):
            return Plan(converging="working on it")
        if resource.spec.get("blocked"):
            return Plan(blocked="a person must act")
        once = bool(resource.spec.get("once"))
        return Plan(actions=(Action("step", resource.name, f"step {resource.name}", once=once),))

    def apply(self, host, resource, action):
        if resource.spec.get("fail"):
            raise ApplyError("it broke")
        if not resource.spec.get("stuck"):
            WORLD[resource.name] = WORLD.get(resource.name, 0) + 1
        WORLD.setdefault("applied", []).append(resource.name)
        return "stepped"


@pytest.fixture(autouse=True)
def toy_kind(monkeypatch):
    monkeypatch.setitem(KINDS, "toys", Kind("toy", "test_engine:ToyReconciler"))
    WORLD.clear()
    yield


class Host(ScriptedHost):
    def __init__(self):
        super().__init__(name="toy-host")


def state(*resources: Resource, host: str | None = None) -> LoadedState:
    return LoadedState("toy.yaml", 1, host, {}, tuple(order_resources(list(resources))))


def toy(name, want=1, needs=(), **spec):
    return Resource(id=f"toy:{name}", kind="toy", name=name, spec={"want": want, **spec}, needs=tuple(needs))


def statuses(report):
    return {r.resource.id: r.status.value for r in report.resources}


def test_diff_changes_nothing_and_reports_drift():
    report = Engine(state(toy("a"), toy("b", want=0)), Host()).diff()
    assert statuses(report) == {"toy:a": "drift", "toy:b": "ok"}
    assert report.exit_code == 2 and "applied" not in WORLD


def test_apply_converges_and_verifies():
    log = ActionLog()
    report = Engine(state(toy("a", want=2)), Host(), journal=log).apply()
    assert statuses(report) == {"toy:a": "ok"} and report.exit_code == 0
    # two passes: each step reveals the next
    assert WORLD["applied"] == ["a", "a"]
    # each action: its intent before it starts, its result when it ends, then what verification saw
    assert [(e["event"], e["resource"], e.get("action"), e.get("before"), e.get("result"), e.get("after"))
            for e in log.entries] == [
        ("intent", "toy:a", "step", {"level": 0}, None, None),
        ("result", "toy:a", "step", None, "done", None),
        ("verified", "toy:a", None, None, None, {"level": 1}),
        ("intent", "toy:a", "step", {"level": 1}, None, None),
        ("result", "toy:a", "step", None, "done", None),
        ("verified", "toy:a", None, None, None, {"level": 2}),
    ]
    assert len({e["run"] for e in log.entries}) == 1


class FailingJournal(ActionLog):
    """A journal whose writes fail (ENOSPC) from the `fail_from`-th line on."""

    def __init__(self, fail_from: int):
        super().__init__()
        self.fail_from = fail_from

    def __call__(self, entry):
        if len(self.entries) + 1 >= self.fail_from:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().__call__(entry)


def test_an_intent_that_cannot_be_journaled_refuses_the_action():
    log = FailingJournal(fail_from=1)
    report = Engine(state(toy("a", want=1), toy("b", want=1)), Host(), journal=log).apply()
    assert "applied" not in WORLD and log.entries == []  # nothing done without a record
    assert statuses(report) == {"toy:a": "error", "toy:b": "error"} and report.exit_code == 1
    for res in report.resources:
        [act] = res.actions
        assert act.result.value == "failed" and "journal cannot be written (No space left on device)" in act.message


def test_a_result_that_cannot_be_journaled_is_said_loudly_and_stops_the_run():
    log = FailingJournal(fail_from=2)  # the intent is written, the result is not
    report = Engine(state(toy("a", want=1), toy("b", want=1)), Host(), journal=log).apply()
    assert WORLD["applied"] == ["a"]  # a was carried out, b was not: its intent could not be written
    assert [e["event"] for e in log.entries] == ["intent"]
    a, b = report.resources
    assert a.status.value == "error" and "result not journaled" in a.actions[0].message
    assert a.actions[0].result.value == "done"
    assert b.status.value == "error" and b.actions[0].message.startswith("not carried out")
    assert report.exit_code == 1


def test_passes_are_bounded():
    report = Engine(state(toy("a", want=10)), Host()).apply()
    assert WORLD["applied"] == ["a"] * 3
    assert statuses(report) == {"toy:a": "drift"} and report.exit_code == 2
    assert "not verified" in report.resources[0].message


def test_an_action_marked_once_is_not_repeated_by_a_later_pass():
    log = ActionLog()
    report = Engine(state(toy("a", want=3, once=True)), Host(), journal=log).apply()
    assert WORLD["applied"] == ["a"]  # the next pass plans it again (level 1 of 3): not carried out
    assert [e["event"] for e in log.entries] == ["intent", "result", "verified"]
    assert statuses(report) == {"toy:a": "drift"} and "not verified" in report.resources[0].message
    report = Engine(state(toy("a", want=3, once=True)), Host(), journal=log).apply()
    assert WORLD["applied"] == ["a", "a"]  # once per apply: the next apply does it again


def test_no_progress_is_not_retried():
    report = Engine(state(toy("a", stuck=True)), Host()).apply()
    assert WORLD["applied"] == ["a"]  # the same action again would change nothing
    assert statuses(report) == {"toy:a": "drift"}


def test_failed_need_blocks_and_skips_dependent():
    report = Engine(state(toy("b", needs=["toy:a"]), toy("a", fail=True)), Host()).apply()
    assert [r.resource.id for r in report.resources] == ["toy:a", "toy:b"]
    a, b = report.resources
    assert a.status.value == "drift" and a.actions[0].result.value == "failed" and "it broke" in a.message
    assert b.status.value == "blocked" and "toy:a is drift" in b.message
    assert [x.result.value for x in b.actions] == ["skipped"]
    assert WORLD.get("b", 0) == 0


def test_need_not_ok_but_nothing_to_do_is_ok():
    report = Engine(state(toy("a", fail=True), toy("b", want=0, needs=["toy:a"])), Host()).apply()
    assert statuses(report)["toy:b"] == "ok"


def test_reobserved_after_host_changed():
    Engine(state(toy("a"), toy("b", want=0)), Host()).apply()
    # one batched observation of both, then b again because a changed the host, then a's verification
    assert WORLD["observed"][0] == ["toy:a", "toy:b"]
    assert ["toy:b"] in WORLD["observed"][1:]


def test_converging_settles_apply_not_diff():
    st = state(toy("job", running=True))
    assert Engine(st, Host()).diff().exit_code == 2
    report = Engine(st, Host()).apply()
    assert statuses(report) == {"toy:job": "converging"} and report.exit_code == 0


def test_blocked_and_error_statuses_and_exit_codes():
    report = Engine(state(toy("a", blocked=True)), Host()).apply()
    assert statuses(report) == {"toy:a": "blocked"} and report.exit_code == 2
    report = Engine(state(toy("a", unobservable=True), toy("b")), Host()).apply()
    assert statuses(report) == {"toy:a": "error", "toy:b": "ok"} and report.exit_code == 1
    assert report.resources[0].message == "cannot see it"


def test_wrong_host_refused_by_apply_reported_by_diff():
    from reconcile_host.pipeline.engine import HostMismatch

    st = state(toy("a"), host="kpro6-*")
    with pytest.raises(HostMismatch):
        Engine(st, Host()).apply()
    report = Engine(st, Host()).diff()
    assert report.host_matches is False and "kpro6-*" in report.notes[0]
    assert "applied" not in WORLD


def test_order_by_needs_then_rank_then_declaration():
    res = [toy("c"), toy("b", needs=["toy:c"]), toy("a")]
    assert [r.id for r in order_resources(res)] == ["toy:c", "toy:b", "toy:a"]
    unit = Resource(id="unit:x.service", kind="unit", name="x.service", spec={})
    gpus = Resource(id="gpus", kind="gpus", name="gpus", spec={})
    mount = Resource(id="mount:/data", kind="mount", name="/data", spec={})
    ext = Resource(id="extraction:e", kind="extraction", name="e", spec={})
    assert [r.id for r in order_resources([ext, mount, gpus, unit])] == [
        "unit:x.service", "gpus", "mount:/data", "extraction:e"]


class WaitingToyReconciler(ToyReconciler):
    """A second kind whose observe meets the first kind's at a barrier: it only gets past it
    when both kinds are observed at the same time."""

    key, kind = "waits", "wait"

    def observe(self, host, resources):
        WORLD["barrier"].wait()
        return {r.id: ToyObserved(WORLD.get(r.name, 0)) for r in resources}


class ForkingToyReconciler(ToyReconciler):
    key, kind = "forks", "fork"
    forks_to_observe = True

    def observe(self, host, resources):
        import threading

        WORLD["threads_while_forking"] = threading.active_count()
        return super().observe(host, resources)


class BarrierToyReconciler(ToyReconciler):
    def observe(self, host, resources):
        WORLD["barrier"].wait()
        return super().observe(host, resources)


def test_kinds_observed_concurrently_forking_kinds_first(monkeypatch):
    import threading

    monkeypatch.setitem(KINDS, "toys", Kind("toy", "test_engine:BarrierToyReconciler"))
    for key, kind, cls in (("waits", "wait", "WaitingToyReconciler"), ("forks", "fork", "ForkingToyReconciler")):
        monkeypatch.setitem(KINDS, key, Kind(kind, f"test_engine:{cls}"))
    WORLD["barrier"] = threading.Barrier(2, timeout=10)
    waiting = Resource(id="wait:w", kind="wait", name="w", spec={"want": 0})
    forking = Resource(id="fork:f", kind="fork", name="f", spec={"want": 0})
    before = threading.active_count()  # other tests' helpers (a console copier) may run threads
    report = Engine(state(toy("a", want=0), waiting, forking), Host()).diff()
    assert statuses(report) == {"toy:a": "ok", "wait:w": "ok", "fork:f": "ok"}  # no BrokenBarrierError
    assert WORLD["threads_while_forking"] == threading.active_count() == before


@dataclass(frozen=True)
class PidObserved:
    level: int
    pid: int  # the process that observed it


class ChildToyReconciler(ToyReconciler):
    """A kind observed in a forked child: behaviour from its spec (sleep, raise)."""

    key, kind = "childs", "child"

    def observe_deadline(self, resources):
        return max(r.spec.get("deadline", 10.0) for r in resources)

    def observe(self, host, resources):
        import os
        import time

        for r in resources:
            if r.spec.get("sleep"):
                time.sleep(r.spec["sleep"])
            if r.spec.get("boom"):
                raise RuntimeError("boom")
        return {r.id: PidObserved(WORLD.get(r.name, 0), os.getpid()) for r in resources}


def child_engine(monkeypatch, *resources):
    from reconcile_host.local.host import LocalHost as RealHost

    monkeypatch.setitem(KINDS, "childs", Kind("child", "test_engine:ChildToyReconciler"))
    return Engine(state(*resources), RealHost())


def child(name, **spec):
    return Resource(id=f"child:{name}", kind="child", name=name, spec={"want": 0, **spec})


def test_kind_with_a_deadline_is_observed_in_a_child(monkeypatch):
    import os

    report = child_engine(monkeypatch, toy("a", want=0), child("c")).diff()
    assert statuses(report) == {"toy:a": "ok", "child:c": "ok"}
    observed = next(r.observed for r in report.resources if r.resource.id == "child:c")
    assert isinstance(observed, PidObserved) and observed.pid != os.getpid()


def test_child_past_its_deadline_is_abandoned_and_reported(monkeypatch):
    import os
    import time

    t0 = time.monotonic()
    report = child_engine(monkeypatch, toy("a", want=0), child("c", sleep=60, deadline=0.5)).diff()
    assert time.monotonic() - t0 < 10
    assert statuses(report) == {"toy:a": "ok", "child:c": "error"}
    [msg] = [r.message for r in report.resources if r.resource.id == "child:c"]
    assert msg.startswith("observing child did not finish within 500ms: "), msg
    pid = int(msg.rsplit("observer pid ", 1)[1].split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # SIGKILLed: gone, or a zombie of ours
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"observer {pid} still running")
    # The next observation reaps it (a long-lived `watch` must not pile up zombies).
    child_engine(monkeypatch, child("c2")).diff()
    assert not os.path.exists(f"/proc/{pid}"), "the abandoned observer was not reaped"


def test_bug_in_a_child_is_an_error_of_that_kind_only(monkeypatch):
    monkeypatch.delenv("RECONCILE_DEBUG", raising=False)
    report = child_engine(monkeypatch, toy("a", want=0), child("c", boom=True)).diff()
    assert statuses(report) == {"toy:a": "ok", "child:c": "error"}
    [msg] = [r.message for r in report.resources if r.resource.id == "child:c"]
    assert msg == "internal error while observing: RuntimeError: boom"


def test_prefetched_child_is_taken_over_not_forked_again(monkeypatch):
    """engine.Prefetch starts a child-observed kind while the state is still being built; the
    engine then uses that very child's answer."""
    from reconcile_host.pipeline.engine import Prefetch

    engine = child_engine(monkeypatch, toy("a", want=0), child("c"))
    prefetch = Prefetch(engine.host)
    prefetch(ChildToyReconciler(), [child("c")])
    prefetch(ToyReconciler(), [toy("a", want=0)])  # observed in-process: nothing started
    [(started, _deadline)] = list(prefetch._started.values())
    engine.prefetch = prefetch
    report = engine.diff()
    assert statuses(report) == {"toy:a": "ok", "child:c": "ok"}
    observed = next(r.observed for r in report.resources if r.resource.id == "child:c")
    assert observed.pid == started.pid
    assert prefetch.take([child("c")]) is None  # taken once


def _beat_then_answer(out):
    import time

    for _ in range(12):  # 0.6 s of progress, one heartbeat each 50 ms
        out.write(b".")
        time.sleep(0.05)
    out.write(b"answer")


def test_heartbeats_waiting_in_the_pipe_count_when_the_caller_comes_late():
    """A caller busy elsewhere past a child's first deadline reads what the child wrote meanwhile
    before judging it: a child that kept making progress is not cut short."""
    import time

    from reconcile_host.local.host import LocalHost as RealHost
    from reconcile_host.local.host import collect_children

    child = RealHost().fork_call(_beat_then_answer)
    time.sleep(0.4)  # the caller is busy: the child's first deadline (0.2 s) passes unread
    [(said, finished)] = collect_children({"c": (child, time.monotonic() - 0.2)}, {"c": 0.3}).values()
    assert finished and said.lstrip(b".") == b"answer"


def _answer_then_linger(seconds, out):
    import time

    out.write(b"answer")
    out.close()  # EOF for the reader; the child is still there for a while
    time.sleep(seconds)
    os._exit(3)


def test_a_child_is_reaped_as_it_exits_and_waited_for_no_longer_than_asked():
    """ForkedChild.wait: the exit status once the child is gone (however long it stays after its
    EOF), and None at the deadline for one that stays (a child stuck in D-state cannot be reaped)."""
    import time

    from reconcile_host.local.host import LocalHost as RealHost

    child = RealHost().fork_call(_answer_then_linger, 0.3)
    assert child.stdout.read() == b"answer"
    assert child.wait(timeout=10) == 3
    stuck = RealHost().fork_call(_answer_then_linger, 30)
    t0 = time.monotonic()
    assert stuck.wait(timeout=0.2) is None
    assert time.monotonic() - t0 < 5
    stuck.kill()
    assert stuck.wait(timeout=10) == -9
