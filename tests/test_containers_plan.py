"""Containers, pure layer and reference data: what the engines said (tests/data/containers/, captured
from the real docker 20.10, docker CLI 28 and podman 4.3) read as reconcile reads it, and observed
facts in, drift and plan out. The host is a stand-in that replays those captured answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from host_doubles import ScriptedHost
from reconcile_host.core.contract import Context, ObserveError, Resource
from reconcile_host.core.host import CommandResult
from reconcile_host.pipeline.engine import judge
from reconcile_host.reconcilers.containers import ContainersReconciler
from reconcile_host.reconcilers.containers.cgroup import container_of_cgroup, service_of_cgroup
from reconcile_host.reconcilers.containers.engines import image_ref, inspect, restart_settable
from reconcile_host.reconcilers.containers.observed import ContainerObserved, ContainerRef
from reconcile_host.reconcilers.gpus.memory import allowed, memory_plan
from reconcile_host.reconcilers.gpus.observed import Gpu, GpusObserved, GpuUse, Holder

DATA = Path(__file__).parent / "data" / "containers"
R = ContainersReconciler()
ID = "a" * 64


class Replay(ScriptedHost):
    """Answers each command with a captured (returncode, stdout file, stderr file)."""

    def __init__(self, answers):
        super().__init__()
        self.answers = answers

    def run(self, argv, timeout=30.0, env=None, input=None):
        self.calls.append(list(argv))
        rc, out, err = self.answers[argv[0]] if argv[1] == "inspect" else self.answers[(argv[0], argv[1])]
        text = lambda f: (DATA / f).read_text() if f else ""  # noqa: E731
        return CommandResult(tuple(argv), rc, text(out), text(err))


DOCKER_OK = (1, "docker-20.10-inspect.json", "docker-20.10-inspect.stderr")
PODMAN_OK = (125, "podman-4.3-inspect.json", "podman-4.3-inspect.stderr")
NOT_INSTALLED_RC = (127, "", "")


def test_docker_inspect_as_captured():
    a = inspect(Replay({"docker": DOCKER_OK}), "docker", ["vllm", "job", "ghost"])
    assert not a.error and a.missing == {"ghost"}
    res = {r.name: r for r in R.resources({"vllm": {"restart": "no"}, "job": {"running": False}})}
    seen = R._one(res["vllm"], {"docker": a, "podman": inspect(Replay({"podman": NOT_INSTALLED_RC}), "podman", [])},
                  False, lambda e: True)
    assert (seen.engine, seen.running, seen.restart, seen.image) == ("docker", True, "unless-stopped",
                                                                     "vllm/vllm-openai:v0.6.3")
    assert seen.compose == ("serve", "vllm")
    job = R._one(res["job"], {"docker": a, "podman": inspect(Replay({"podman": NOT_INSTALLED_RC}), "podman", [])},
                 False, lambda e: True)
    assert (job.running, job.restart, job.status) == (False, "on-failure:3", "exited")


def test_podman_inspect_as_captured():
    a = inspect(Replay({"podman": PODMAN_OK}), "podman", ["vllm", "plain", "ghost"])
    assert not a.error and a.missing == {"ghost"}
    res = R.resources({"plain": {"engine": "podman", "restart": "no"}})[0]
    seen = R._one(res, {"podman": a}, False, lambda e: False)
    assert seen.restart == "no" and seen.running is True  # podman's "" policy is no
    assert not R.diff(res, seen)
    assert not restart_settable(Replay({("podman", "update"): (0, "podman-4.3-update-help.txt", "")}), "podman")


@pytest.mark.parametrize("stderr", ["docker-20.10-unreachable.stderr", "docker-cli-28-unreachable.stderr"])
def test_unreachable_daemon_is_never_missing(stderr):
    a = inspect(Replay({"docker": (1, "", stderr)}), "docker", ["vllm"])
    assert a.missing == set() and "Cannot connect to the Docker daemon" in a.error
    podman = inspect(Replay({"podman": PODMAN_OK}), "podman", ["vllm", "ghost"])
    ghost = R.resources({"ghost": {"running": False}})[0]  # podman has none; docker might
    seen = R._one(ghost, {"docker": a, "podman": podman}, False, lambda e: True)
    assert isinstance(seen, ObserveError) and "declare `engine:`" in str(seen)
    # podman has it: taken as podman's, with what could not be known said.
    seen = R._one(R.resources({"vllm": {"running": False}})[0], {"docker": a, "podman": podman}, False, None)
    assert seen.engine == "podman" and "Cannot connect" in seen.note and "engine: podman" in seen.note


def test_newer_cli_words_missing_differently():
    a = inspect(Replay({"docker": (1, "", "docker-cli-28-missing.stderr")}), "docker", ["ghost"])
    assert a.missing == {"ghost"} and not a.error


def test_both_engines_having_the_name_is_an_error():
    res = R.resources({"vllm": {"running": False}})[0]
    answers = {"docker": inspect(Replay({"docker": DOCKER_OK}), "docker", ["vllm"]),
               "podman": inspect(Replay({"podman": PODMAN_OK}), "podman", ["vllm"])}
    seen = R._one(res, answers, False, lambda e: True)
    assert isinstance(seen, ObserveError) and "both docker and podman" in str(seen)


def test_engine_not_installed():
    none = {e: inspect(Replay({e: NOT_INSTALLED_RC}), e, ["x"]) for e in ("docker", "podman")}
    assert isinstance(R._one(R.resources({"x": {"running": False}})[0], none, False, None), ObserveError)
    declared = R.resources({"x": {"engine": "docker", "running": False}})[0]
    assert "docker is not installed" in str(R._one(declared, none, False, None))


CGROUPS = [
    ("docker cgroupfs", f"12:pids:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/docker/{ID}\n", ("docker", ID)),
    ("docker systemd driver", f"0::/system.slice/docker-{ID}.scope\n", ("docker", ID)),
    ("podman cgroupfs", f"9:name=systemd:/libpod_parent/libpod-{ID}\n", ("podman", ID)),
    ("podman systemd driver", f"0::/machine.slice/libpod-{ID}.scope/container\n", ("podman", ID)),
    ("podman --cgroups=split", f"0::/system.slice/container-vllm.service/libpod-payload-{ID}\n", ("podman", ID)),
    ("a unit", "0::/system.slice/vllm.service\n", None),
    ("conmon", f"0::/machine.slice/libpod-conmon-{ID}.scope\n", None),
    ("extra v1 hierarchies first", f"18:net_cls,net_prio:/\n4:memory:/docker/{ID}\n", ("docker", ID)),
    ("a process in a cgroup below its container's", f"0::/system.slice/docker-{ID}.scope/init\n", ("docker", ID)),
    # A cgroup of any name a user makes in their delegated subtree is theirs, not an engine's.
    ("a user's delegated docker-<id>.scope",
     f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{ID}.scope\n", None),
    ("a user's delegated libpod scope",
     f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n", None),
    ("a docker-<id>.scope inside a service", f"0::/system.slice/vllm.service/docker-{ID}.scope\n", None),
    ("a /docker/<id> inside a user's session", f"0::/user.slice/user-1000.slice/session-3.scope/docker/{ID}\n", None),
    ("a libpod payload in a user's manager",
     f"0::/user.slice/user-1000.slice/user@1000.service/x.service/libpod-payload-{ID}\n", None),
    # Docker in docker: the host's engine created the outer one, and can stop only that.
    ("docker in docker", f"0::/docker/{ID}/docker/{'b' * 64}\n", ("docker", ID)),
]


@pytest.mark.parametrize("text,want", [c[1:] for c in CGROUPS], ids=[c[0] for c in CGROUPS])
def test_container_of_cgroup(text, want):
    assert container_of_cgroup(text) == want


def test_service_of_cgroup():
    assert service_of_cgroup(f"0::/system.slice/container-vllm.service/libpod-payload-{ID}\n") == \
        "container-vllm.service"
    assert service_of_cgroup("0::/user.slice/user-0.slice/user@0.service/app.slice\n") == ""


def test_image_refs_fill_in_the_engines_defaults():
    assert image_ref("vllm/vllm-openai") == image_ref("docker.io/vllm/vllm-openai:latest")
    assert image_ref("localhost/rbox:1") == image_ref("rbox:1") == "rbox:1"
    assert image_ref("busybox") == image_ref("docker.io/library/busybox:latest")
    assert image_ref("reg:5000/x") == "reg:5000/x:latest"


def seen(**kw) -> ContainerObserved:
    base = dict(name="vllm", engine="docker", exists=True, id=ID, status="running", running=True,
                restart="always", image="vllm/vllm-openai:v0.6.3")
    return ContainerObserved(**{**base, **kw})


def plan_for(spec, observed, ctx=None):
    res = R.resources({"vllm": spec})[0]
    drift = R.diff(res, observed)
    plan = R.plan(res, observed, drift, ctx or Context())
    return plan, judge(drift, plan).value


def test_policy_first_then_stop():
    plan, status = plan_for({"running": False, "restart": "no", "stop_timeout": "30s"}, seen())
    assert [a.action for a in plan.actions] == ["update-restart", "stop"] and status == "drift"
    assert plan.actions[1].params["timeout"] == 30.0


def test_podman_43_cannot_change_the_policy():
    plan, status = plan_for({"running": False, "restart": "no"}, seen(engine="podman", restart_settable=False))
    assert [a.action for a in plan.actions] == ["stop"] and status == "blocked"
    assert "podman rm vllm" in plan.blocked and "podman-restart.service" in plan.blocked


def test_on_failure_zero_is_on_failure():
    plan, status = plan_for({"restart": "on-failure:0"}, seen(restart="on-failure"))
    assert status == "ok"


def test_missing():
    gone = ContainerObserved("vllm", "docker/podman", exists=False, running=False, restart="")
    assert plan_for({"running": False, "restart": "no", "image": "x"}, gone)[1] == "ok"
    plan, status = plan_for({"running": True}, gone)
    assert status == "blocked" and "docker run -d --name vllm" in plan.blocked


def test_running_unknown_is_blocked_never_acted_on():
    plan, status = plan_for({"running": False}, seen(engine="podman", running=None, note="podman says ..."))
    assert status == "blocked" and not plan.actions and plan.blocked == "podman says ..."


def test_image_mismatch_is_blocked():
    plan, status = plan_for({"image": "vllm/vllm-openai:v0.7"}, seen())
    assert status == "blocked" and "never pulls or recreates" in plan.blocked and not plan.actions


def test_a_unit_owned_container_is_acted_on_through_the_unit():
    owned = seen(engine="podman", unit="container-vllm.service", unit_from="label PODMAN_SYSTEMD_UNIT")
    plan, status = plan_for({"running": False}, owned)
    assert [(a.action, a.target) for a in plan.actions] == [("stop-unit", "container-vllm.service")]
    plan, status = plan_for({"running": False, "restart": "no"}, owned)
    assert status == "blocked" and "Restart=" in plan.blocked
    unit = Resource("unit:container-vllm.service", "unit", "container-vllm.service", {"active": False})
    plan, status = plan_for({"running": False}, owned, Context({unit.id: unit}))
    assert not plan.actions and "acted on through unit:container-vllm.service" in plan.message
    unit = Resource(unit.id, "unit", unit.name, {"active": True})
    assert plan_for({"running": False}, owned, Context({unit.id: unit}))[1] == "blocked"


# --- gpus: holders in containers ---

def gpus_observed(*holders: Holder) -> GpusObserved:
    gpu = Gpu(index=0, name="g", uuid="GPU-0", bus_id="00000000:11:00.0", memory_total=2**34, memory_used=2**33,
              minor=0)
    return GpusObserved("nvml", "590", (gpu,), tuple(holders), (), ())


def holder(pid=4242, name="sh", container=None, unit=None) -> Holder:
    return Holder(pid=pid, name=name, exe=name, unit=unit, uses=(GpuUse(0, 2**33),), container=container)


VLLM = ContainerRef("docker", ID, "vllm", "vllm/vllm-openai:v0.6.3", "always")
SPEC = {"max_memory_used": 0, "allow": (), "free_with": {"stop_units": True, "stop_containers": True,
                                                         "kill": ("sh", "python*"), "grace": 1.0}}


def gpu_plan(obs, spec=SPEC, ctx=None):
    return memory_plan(spec, obs, {"gpu0.memory_used"}, ctx or Context())


def test_allow_takes_container_names():
    assert allowed(holder(container=VLLM), ["container:vll*"])
    assert not allowed(holder(container=VLLM), ["container:eagle3-*"])
    assert not allowed(holder(), ["container:*"])


def test_a_holder_in_a_container_is_stopped_through_its_engine_never_signalled():
    actions, notes, blocked = gpu_plan(gpus_observed(holder(container=VLLM), holder(4243, container=VLLM)))
    assert [(a.action, a.target, a.params["engine"], a.params["id"]) for a in actions] == [
        ("stop-container", "vllm", "docker", ID)]  # one stop for the container's two holders
    assert "(always) starts it again when dockerd restarts" in actions[0].description
    off = {**SPEC, "free_with": {**SPEC["free_with"], "stop_containers": False}}
    actions, notes, blocked = gpu_plan(gpus_observed(holder(container=VLLM)), off)
    assert not actions and "stop_containers is off" in blocked[0]  # the kill glob `sh` is not used


def test_a_declared_container_is_left_to_the_containers_kind():
    declared = Resource("container:vllm", "container", "vllm", {"running": False})
    actions, notes, blocked = gpu_plan(gpus_observed(holder(container=VLLM)), ctx=Context({declared.id: declared}))
    assert not actions and not blocked and "freed by container:vllm" in notes[0]
    declared = Resource("container:vllm", "container", "vllm", {"running": True})
    actions, notes, blocked = gpu_plan(gpus_observed(holder(container=VLLM)), ctx=Context({declared.id: declared}))
    assert not actions and "declares container:vllm running" in blocked[0]


def test_a_container_a_unit_runs_is_freed_through_the_unit():
    ref = ContainerRef("podman", ID, "vllm", "x", "no", unit="container-vllm.service")
    actions, notes, blocked = gpu_plan(gpus_observed(holder(container=ref)))
    assert [(a.action, a.target) for a in actions] == [("stop", "container-vllm.service")]


def test_a_container_its_engine_cannot_name_is_blocked():
    ref = ContainerRef("docker", ID, error="cannot ask docker: Cannot connect to the Docker daemon")
    actions, notes, blocked = gpu_plan(gpus_observed(holder(container=ref)))
    assert not actions and "nothing was signalled" in blocked[0] and "Cannot connect" in blocked[0]


class Say(ScriptedHost):
    """A host whose every command prints STDOUT and exits RC."""

    def __init__(self, rc: int, stdout: str, stderr: str = ""):
        super().__init__(lambda argv: CommandResult(tuple(argv), rc, stdout, stderr))


def test_compose_selector():
    from reconcile_host.reconcilers.containers.engines import NOT_INSTALLED, compose_key

    assert compose_key(Say(0, f"{ID}\n"), "docker", "serve", "vllm") == ID
    assert compose_key(Say(0, ""), "docker", "serve", "vllm") is None
    assert "scaled" in compose_key(Say(0, f"{ID}\n{'b' * 64}\n"), "docker", "serve", "vllm")
    assert compose_key(Say(127, ""), "podman", "serve", "vllm") == NOT_INSTALLED
    res = R.resources({"vllm": {"compose": {"project": "serve", "service": "vllm"}, "running": False}})[0]
    assert res.spec["compose"] == ("serve", "vllm")
    answers = {"docker": inspect(Replay({"docker": DOCKER_OK}), "docker", ["vllm"]),
               "podman": inspect(Replay({"podman": NOT_INSTALLED_RC}), "podman", [])}
    docker_id = answers["docker"].found["vllm"]["Id"]
    seen = R._one(res, answers, False, None, {"docker": docker_id, "podman": NOT_INSTALLED})
    assert seen.name == "vllm" and seen.compose == ("serve", "vllm")
    scaled = R._one(res, answers, False, None, {"docker": "!compose service serve/vllm has 2", "podman": None})
    assert isinstance(scaled, ObserveError) and "has 2" in str(scaled)
    gone = R._one(res, answers, False, None, {"docker": None, "podman": NOT_INSTALLED})
    assert not gone.exists and not R.diff(res, gone)


def test_owner_unit_from_podmans_label():
    import copy
    import json

    from reconcile_host.reconcilers.containers.engines import observed_of

    entry = copy.deepcopy(next(e for e in json.loads((DATA / "podman-4.3-inspect.json").read_text())
                               if e["Name"] == "vllm"))
    assert observed_of("vllm", "podman", entry, False).unit == ""
    entry["Config"]["Labels"] = {"PODMAN_SYSTEMD_UNIT": "container-vllm.service"}
    seen = observed_of("vllm", "podman", entry, False)
    assert seen.unit == "container-vllm.service" and "PODMAN_SYSTEMD_UNIT" in seen.unit_from
    assert observed_of("vllm", "podman", entry, False, declared_unit="mine.service").unit == "mine.service"
