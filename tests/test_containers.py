"""Containers, real system: reconcile against a real dockerd started by the test (Debian's
docker.io 20.10, tests/container_support.py), each answer checked with `docker inspect` and the
kernel (/proc) at test time, never a literal: a restart policy is shown to work (kill -9, a
daemon restart) before reconcile changes it, and shown not to work after.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import container_support as cs
import pytest
from cli_support import reconcile_json

REASON = cs.missing(cs.DOCKERD, cs.DOCKER, cs.PODMAN)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


@pytest.fixture(scope="module")
def dockerd():
    d = cs.Dockerd().start()
    d.import_image()
    yield d
    d.close()


@pytest.fixture(scope="module")
def podman_store():
    # Every CLI run gets a podman store of its own: a state that does not name the engine makes
    # reconcile ask podman too, which must never touch the host's /var/lib/containers.
    p = cs.Podman()
    yield p
    p.close()


@pytest.fixture
def names(dockerd):
    with cs.fresh_names(lambda *made: dockerd.docker("rm", "-f", *made, check=False)) as new:
        yield new


def reconcile(tmp, dockerd, podman_store, state: str, *args: str, **env: str):
    path = tmp / "state.yaml"
    path.write_text("version: 1\n" + state)
    code, doc, stderr = reconcile_json(tmp, *(args or ("apply",)), str(path), timeout=300,
                                       **{**dockerd.env(), **podman_store.env(), **env})
    assert doc is not None, stderr
    return code, doc


def resource(report: dict, rid: str) -> dict:
    return next(r for r in report["resources"] if r["id"] == rid)


def acted(report: dict) -> list[str]:
    return [a["action"] for r in report["resources"] for a in r.get("actions", ()) if a.get("result") == "done"]


def run_container(dockerd, name: str, restart: str, script: str = "trap 'exit 0' TERM; while :; do sleep 1; done"):
    dockerd.docker("run", "-d", "--name", name, "--network", "none", f"--restart={restart}", cs.IMAGE,
                   "/bin/sh", "-c", script)
    return cs.wait_for(f"{name} running", lambda: (i := dockerd.inspect(name))["State"]["Running"] and i)


def killed_comes_back(dockerd, name: str) -> None:
    """kill -9 the container's process (a host PID, in the container's cgroup): the engine restarts it."""
    before = dockerd.inspect(name)
    pid = cs.host_pid(before)
    assert before["Id"] in Path(f"/proc/{pid}/cgroup").read_text()
    os.kill(pid, signal.SIGKILL)  # the container's process, started by this test
    after = cs.wait_for(f"{name} restarted", lambda: (i := dockerd.inspect(name))["RestartCount"] > before[
        "RestartCount"] and i["State"]["Running"] and i)
    assert cs.host_pid(after) != pid


@pytest.mark.parametrize("policy", ["always", "unless-stopped", "on-failure"])
def test_a_container_set_to_return_is_stopped_for_good(tmp_path, dockerd, podman_store, names, policy):
    name = names("vllm")
    run_container(dockerd, name, policy)
    assert cs.policy(dockerd.inspect(name)) == policy
    killed_comes_back(dockerd, name)  # the engine's truth: killing its process is no way to stop it

    state = f'containers:\n  {name}:\n    running: false\n    restart: "no"\n    stop_timeout: 5s\n'
    rc, report = reconcile(tmp_path, dockerd, podman_store, state, "diff")
    r = resource(report, f"container:{name}")
    assert rc == 2 and r["status"] == "drift"
    assert [a["action"] for a in r["actions"]] == ["update-restart", "stop"]  # policy first

    rc, report = reconcile(tmp_path, dockerd, podman_store, state)
    assert rc == 0, report
    assert acted(report) == ["update-restart", "stop"]
    seen = dockerd.inspect(name)
    assert seen["State"]["Running"] is False and cs.policy(seen) == "no"

    dockerd.restart()  # what a reboot does to the engine: its policies are applied again
    seen = dockerd.inspect(name)
    assert seen["State"]["Running"] is False and cs.policy(seen) == "no"

    rc, report = reconcile(tmp_path, dockerd, podman_store, state)
    assert rc == 0 and acted(report) == []  # apply twice: no action


def test_always_stopped_by_hand_comes_back_at_a_daemon_restart(tmp_path, dockerd, podman_store, names):
    """Why reconcile changes the policy too: `docker stop` alone does not keep an `always` container
    down across a daemon restart (the engine's truth, shown here), `update --restart=no` first does."""
    name = names("vllm")
    run_container(dockerd, name, "always")
    dockerd.docker("stop", "-t", "5", name)
    assert dockerd.inspect(name)["State"]["Running"] is False
    dockerd.restart()
    assert dockerd.inspect(name)["State"]["Running"] is True

    state = f"containers:\n  {name}:\n    running: false\n"  # the policy is left as it is
    rc, report = reconcile(tmp_path, dockerd, podman_store, state)
    assert rc == 0 and acted(report) == ["stop"]
    assert dockerd.inspect(name)["State"]["Running"] is False


def test_restart_policy_alone_is_updated_on_a_running_container(tmp_path, dockerd, podman_store, names):
    name = names("svc")
    run_container(dockerd, name, "no")
    state = f"containers:\n  {name}:\n    running: true\n    restart: on-failure:3\n"
    rc, report = reconcile(tmp_path, dockerd, podman_store, state)
    assert rc == 0 and acted(report) == ["update-restart"]
    seen = dockerd.inspect(name)
    assert seen["State"]["Running"] is True and cs.policy(seen) == "on-failure:3"
    assert seen["HostConfig"]["RestartPolicy"]["MaximumRetryCount"] == 3
    killed_comes_back(dockerd, name)  # the policy reconcile set is one the engine acts on
    rc, report = reconcile(tmp_path, dockerd, podman_store, state)
    assert rc == 0 and acted(report) == []


def test_a_stopped_container_is_started(tmp_path, dockerd, podman_store, names):
    name = names("svc")
    run_container(dockerd, name, "no")
    dockerd.docker("stop", "-t", "5", name)
    rc, report = reconcile(tmp_path, dockerd, podman_store, f"containers:\n  {name}:\n    running: true\n")
    assert rc == 0 and acted(report) == ["start"]
    assert dockerd.inspect(name)["State"]["Running"] is True


def test_missing_container(tmp_path, dockerd, podman_store, names):
    name = names("ghost")
    said = dockerd.docker("inspect", "--type", "container", name, check=False)
    assert said.returncode != 0 and "No such container" in said.stderr  # the engine's word: not there
    rc, report = reconcile(tmp_path, dockerd, podman_store, f"containers:\n  {name}:\n    running: false\n",
                           "diff")
    assert rc == 0 and resource(report, f"container:{name}")["status"] == "ok"
    rc, report = reconcile(tmp_path, dockerd, podman_store, f"containers:\n  {name}:\n    running: true\n")
    r = resource(report, f"container:{name}")
    assert rc == 2 and r["status"] == "blocked"
    assert f"--name {name}" in r["message"] and "never creates" in r["message"]


def test_unreachable_daemon_is_an_error(tmp_path, dockerd, podman_store, names):
    name = names("vllm")
    run_container(dockerd, name, "always")
    gone = f"unix://{tmp_path}/no-daemon.sock"
    said = dockerd.docker("version", check=False)
    assert said.returncode == 0
    said = cs.subprocess.run([cs.DOCKER, "inspect", name], capture_output=True, text=True,
                             env={**os.environ, **dockerd.env(), "DOCKER_HOST": gone})
    assert said.returncode == 1 and "Cannot connect to the Docker daemon" in said.stderr  # as missing's exit code
    for engine in ("    engine: docker\n", ""):
        state = f"containers:\n  {name}:\n{engine}    running: false\n"
        for cmd in ("diff", "apply"):
            rc, report = reconcile(tmp_path, dockerd, podman_store, state, cmd, DOCKER_HOST=gone)
            r = resource(report, f"container:{name}")
            assert rc == 1 and r["status"] == "error", r
            assert "Cannot connect to the Docker daemon" in r["message"]
    assert dockerd.inspect(name)["State"]["Running"] is True  # nothing was done to it


def test_image_mismatch_is_blocked(tmp_path, dockerd, podman_store, names):
    name = names("vllm")
    run_container(dockerd, name, "no")
    created_from = dockerd.inspect(name)["Config"]["Image"]
    state = f"containers:\n  {name}:\n    image: vllm/vllm-openai:v0.6.3\n"
    rc, report = reconcile(tmp_path, dockerd, podman_store, state, "diff")
    r = resource(report, f"container:{name}")
    assert rc == 2 and r["status"] == "blocked"
    assert r["drift"] == [{"field": "image", "want": "vllm/vllm-openai:v0.6.3", "have": created_from}]
    rc, report = reconcile(tmp_path, dockerd, podman_store, f"containers:\n  {name}:\n    image: {created_from}\n",
                           "diff")
    assert rc == 0


def test_a_compose_service_selected_by_its_labels(tmp_path, dockerd, podman_store, names):
    name = names("serve-vllm")  # as docker compose names it: PROJECT-SERVICE-N
    project = name.split("-", 1)[1]
    dockerd.docker("run", "-d", "--name", name, "--network", "none", "--restart=always",
                   "--label", f"com.docker.compose.project={project}", "--label", "com.docker.compose.service=vllm",
                   cs.IMAGE, "/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done")
    state = (f'containers:\n  vllm:\n    engine: docker\n    compose: {{project: {project}, service: vllm}}\n'
             '    running: false\n    restart: "no"\n')
    rc, report = reconcile(tmp_path, dockerd, podman_store, state)
    r = resource(report, "container:vllm")
    assert rc == 0 and [a["target"] for a in r["actions"]] == [name, name]  # docker's name for it
    seen = dockerd.inspect(name)
    assert seen["State"]["Running"] is False and cs.policy(seen) == "no"
    assert seen["Config"]["Labels"]["com.docker.compose.project"] == project
    other = state.replace(f"project: {project}", "project: nothing-here")
    rc, report = reconcile(tmp_path, dockerd, podman_store, other, "diff")
    assert rc == 0 and resource(report, "container:vllm")["status"] == "ok"  # no such service: not running


def test_after_the_policy_change_kill_9_is_not_undone(tmp_path, dockerd, podman_store, names):
    """Verified against the policy itself: a running `always` container set to `no` by reconcile,
    then killed -9, is left exited. Conclusive without a clock: dockerd decides at the exit, and
    marks a container it will restart `restarting`, one it will not `exited` (daemon/monitor.go,
    handleContainerExit)."""
    name = names("vllm")
    run_container(dockerd, name, "always")
    killed_comes_back(dockerd, name)
    state = f'containers:\n  {name}:\n    running: true\n    restart: "no"\n'
    rc, report = reconcile(tmp_path, dockerd, podman_store, state)
    assert rc == 0 and acted(report) == ["update-restart"]
    before = dockerd.inspect(name)
    os.kill(cs.host_pid(before), signal.SIGKILL)  # the container's process, started by this test
    after = cs.wait_for("the exit handled", lambda: (i := dockerd.inspect(name))["State"]["Status"] in (
        "exited", "restarting") and i)
    assert after["State"]["Status"] == "exited" and after["RestartCount"] == before["RestartCount"]
    dockerd.restart()
    assert dockerd.inspect(name)["State"]["Running"] is False
    rc, report = reconcile(tmp_path, dockerd, podman_store, state, "diff")
    assert rc == 2 and [a["action"] for a in resource(report, f"container:{name}")["actions"]] == ["start"]
