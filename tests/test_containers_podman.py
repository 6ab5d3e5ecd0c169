"""Containers, real system, Podman: reconcile against Debian's podman 4.3, rootful with a store of
its own (tests/container_support.py), each answer checked with `podman inspect`, `podman update
--help` and /proc at test time."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import container_support as cs
import gpu_support as gs
import pytest
from cli_support import reconcile_json

REASON = cs.missing(cs.PODMAN)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
LOOP = "trap 'exit 0' TERM; while :; do sleep 1; done"


@pytest.fixture(scope="module")
def podman():
    p = cs.Podman()
    yield p
    p.close()


@pytest.fixture
def names(podman):
    with cs.fresh_names(lambda *made: podman.podman("rm", "-f", "-t", "0", *made, check=False)) as new:
        yield new


def reconcile(tmp: Path, podman, state: str, *args: str, **env: str):
    path = tmp / "state.yaml"
    path.write_text("version: 1\n" + state)
    code, doc, stderr = reconcile_json(tmp, *(args or ("apply",)), str(path), timeout=300, **{**podman.env(), **env})
    assert doc is not None, stderr
    return code, doc


def resource(report: dict, rid: str) -> dict:
    return next(r for r in report["resources"] if r["id"] == rid)


def acted(report: dict) -> list[str]:
    return [a["action"] for r in report["resources"] for a in r.get("actions", ()) if a.get("result") == "done"]


def start(podman, name: str, restart: str, script: str = LOOP) -> dict:
    podman.run(name, restart, "/bin/sh", "-c", script)
    return cs.wait_for(f"{name} running", lambda: (i := podman.inspect(name))["State"]["Running"] and i)


def killed_comes_back(podman, name: str) -> None:
    before = podman.inspect(name)
    pid = cs.host_pid(before)
    assert before["Id"] in Path(f"/proc/{pid}/cgroup").read_text()  # /libpod_parent/libpod-<id>
    os.kill(pid, signal.SIGKILL)  # the container's process, started by this test
    cs.wait_for(f"{name} restarted by conmon", lambda: (i := podman.inspect(name))["RestartCount"] > before[
        "RestartCount"] and i["State"]["Running"])


def test_always_is_stopped_and_the_policy_change_blocked_with_the_step(tmp_path, podman, names):
    name = names("vllm")
    start(podman, name, "always")
    killed_comes_back(podman, name)
    can_update = "--restart" in podman.podman("update", "--help").stdout  # podman's own answer, not a version
    state = f'containers:\n  {name}:\n    engine: podman\n    running: false\n    restart: "no"\n'
    rc, report = reconcile(tmp_path, podman, state)
    r = resource(report, f"container:{name}")
    seen = podman.inspect(name)
    assert seen["State"]["Running"] is False
    if can_update:  # podman 5: changed in place, policy first
        assert rc == 0 and acted(report) == ["update-restart", "stop"] and cs.policy(seen) == "no"
        return
    assert rc == 2 and r["status"] == "blocked" and acted(report) == ["stop"]
    assert cs.policy(seen) == "always"  # nothing recreated behind the owner's back
    assert f"podman rm {name}" in r["message"] and "--restart=no" in r["message"]
    # Why it is blocked rather than ok: at boot podman-restart.service runs exactly this, and the
    # container comes back (the engine's truth).
    podman.podman("start", "--all", "--filter", "restart-policy=always")
    assert podman.inspect(name)["State"]["Running"] is True


@pytest.mark.parametrize("policy", ["unless-stopped", "on-failure"])
def test_stopped_through_podman(tmp_path, podman, names, policy):
    name = names("svc")
    start(podman, name, policy)
    killed_comes_back(podman, name)
    state = f"containers:\n  {name}:\n    running: false\n    stop_timeout: 5s\n"
    rc, report = reconcile(tmp_path, podman, state)
    assert rc == 0 and acted(report) == ["stop"], report
    assert resource(report, f"container:{name}")["summary"].startswith("podman ")  # found without `engine:`
    seen = podman.inspect(name)
    assert seen["State"]["Running"] is False and seen["State"]["Status"] == "exited"
    rc, report = reconcile(tmp_path, podman, state)
    assert rc == 0 and acted(report) == []


def test_missing_podman_container(tmp_path, podman, names):
    name = names("ghost")
    said = podman.podman("inspect", "--type", "container", name, check=False)
    assert said.returncode != 0 and "no such container" in said.stderr
    state = f"containers:\n  {name}:\n    engine: podman\n    running: false\n"
    assert reconcile(tmp_path, podman, state, "diff")[0] == 0
    rc, report = reconcile(tmp_path, podman, state.replace("false", "true"))
    assert rc == 2 and resource(report, f"container:{name}")["status"] == "blocked"


def test_running_for_a_pid_that_is_gone_is_reported_not_believed(tmp_path, podman, names):
    """Once conmon died, nothing records the container's exit: podman's state keeps saying running."""
    name = names("orphan")
    seen = start(podman, name, "no")
    conmon, pid = int(seen["State"]["ConmonPid"]), cs.host_pid(seen)
    os.kill(conmon, signal.SIGKILL)  # conmon and the container's process were started by this test
    os.kill(pid, signal.SIGKILL)
    cs.wait_for("the process gone", lambda: not gs.proc_alive(pid))
    seen = podman.inspect(name)
    if not seen["State"]["Running"]:
        pytest.skip("this podman noticed the exit without conmon [ci-ok]")
    rc, report = reconcile(tmp_path, podman, f"containers:\n  {name}:\n    running: false\n", "diff")
    r = resource(report, f"container:{name}")
    assert rc == 2 and r["status"] == "blocked" and r.get("actions", []) == []
    assert f"PID {seen['State']['Pid']}" in r["message"] and "conmon" in r["message"]


def test_gpu_holder_in_a_podman_container(tmp_path, podman, names, fake_lib):
    name = names("vllm")
    tag = gs.new_tag()
    device = tmp_path / "nvidia0"
    device.touch()
    config = gs.FakeConfig(gpus=gs.seed_gpus(1), holders=[gs.FakeHolder(mib=70000, gpus=[0], cmdline=tag)]).write(
        tmp_path / "nvml.conf")
    podman.podman("run", "-d", "--name", name, "--network", "none", "--restart=always", "-v",
                  f"{device}:/dev/nvidia0", "--rootfs", str(podman.rootfs), "/bin/sh", "-c",
                  "trap 'exit 0' TERM; exec 3</dev/nvidia0; while :; do sleep 1 3<&-; done", tag)
    seen = cs.wait_for("holding", lambda: (i := podman.inspect(name))["State"]["Running"] and "/dev/nvidia0" in [
        os.readlink(f"/proc/{i['State']['Pid']}/fd/{fd}") for fd in os.listdir(f"/proc/{i['State']['Pid']}/fd")]
        and i)
    state = "gpus:\n  max_memory_used: 0MiB\n  free_with:\n    stop_containers: true\n"
    env = gs.nvml_env(fake_lib, config)
    rc, report = reconcile(tmp_path, podman, state, "diff", **env)
    r = resource(report, "gpus")
    assert [a["action"] for a in r["actions"]] == ["stop-container"]
    assert f"{cs.host_pid(seen)} (sh) in container:{name} (podman, restart always)" in r["actions"][0]["description"]
    rc, report = reconcile(tmp_path, podman, state, **env)
    assert rc == 0 and acted(report) == ["stop-container"]
    assert podman.inspect(name)["State"]["Running"] is False
