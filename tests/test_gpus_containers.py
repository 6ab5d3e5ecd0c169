"""The seed story with vLLM as a container: GPU holders mapped to their containers, freed through
the engine. A real dockerd (tests/container_support.py) runs `vllm`, whose process holds a fake
GPU device (a bind-mounted file as /dev/nvidia0, held open), and `eagle3-extract`, the allowed
extraction; the fake NVML (the only double) reports the vLLM process's host PID holding memory on
all 8 GPUs. The state is states/kpro6-recovery-containers.yaml's containers and gpus sections.
Every answer is checked with `docker inspect`, /proc and pynvml at test time.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import container_support as cs
import gpu_support as gs
import pytest
from cli_support import reconcile_json

REPO = Path(__file__).resolve().parent.parent
REASON = cs.missing(cs.DOCKERD, cs.DOCKER, cs.PODMAN)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
HOLD_MIB, EXTRACT_MIB = 72289, 2048
# Holds /dev/nvidiaN open as fd 3 (the sleeps it runs do not inherit it), and leaves on SIGTERM.
HOLD = "trap 'exit 0' TERM; exec 3</dev/nvidia{n}; while :; do sleep 1 3<&-; done"


@pytest.fixture(scope="module")
def engines():
    d = cs.Dockerd().start()
    d.import_image("vllm/vllm-openai:v0.6.3")
    d.import_image(cs.IMAGE)
    p = cs.Podman()
    yield d, p
    d.close()
    p.close()


class Story:
    def __init__(self, tmp: Path, lib: Path, dockerd, podman):
        self.tmp, self.lib, self.dockerd, self.podman = tmp, lib, dockerd, podman
        self.config = tmp / "nvml.conf"
        self.tags = {"vllm": gs.new_tag(), "eagle3-extract": gs.new_tag()}
        gs.FakeConfig(gpus=gs.seed_gpus(8), holders=[
            gs.FakeHolder(mib=HOLD_MIB, gpus=range(8), cmdline=self.tags["vllm"]),
            gs.FakeHolder(mib=EXTRACT_MIB, gpus=range(8), cmdline=self.tags["eagle3-extract"]),
        ]).write(self.config)

    def run(self, name: str, image: str, restart: str, gpu: int) -> dict:
        device = self.tmp / f"nvidia{gpu}"
        device.touch()
        self.dockerd.docker("run", "-d", "--name", name, "--network", "none", f"--restart={restart}",
                            "-v", f"{device}:/dev/nvidia{gpu}", image, "/bin/sh", "-c", HOLD.format(n=gpu),
                            self.tags[name])
        return cs.wait_for(f"{name} holding /dev/nvidia{gpu}", lambda: self.holding(name, gpu))

    def holding(self, name: str, gpu: int) -> dict | None:
        """docker inspect of NAME once its process (a host PID) has /dev/nvidiaGPU open."""
        seen = self.dockerd.inspect(name)
        pid = cs.host_pid(seen)
        try:
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            return None
        return seen if f"/dev/nvidia{gpu}" in fds else None

    def state(self, edit=None) -> Path:
        from ruamel.yaml import YAML

        yaml = YAML()
        doc = yaml.load((REPO / "states" / "kpro6-recovery-containers.yaml").read_text())
        for key in ("host", "mounts", "extractions"):
            doc.pop(key)  # the mounts and the extraction are the unit form's test (test_seed_recovery.py)
        doc["gpus"].pop("settings")  # set through nvidia-persistenced.service: needs a systemd
        if edit is not None:
            edit(doc)
        buf = io.StringIO()
        yaml.dump(doc, buf)
        out = self.tmp / "state.yaml"
        out.write_text(buf.getvalue())
        return out

    def cli(self, cmd: str, state: Path) -> tuple[int, dict]:
        code, doc, stderr = reconcile_json(self.tmp, cmd, str(state), timeout=300, **{
            **self.dockerd.env(), **self.podman.env(), **gs.nvml_env(self.lib, self.config)})
        assert doc is not None, stderr
        return code, doc

    def nvml(self) -> list[dict]:
        out = subprocess.run(gs.pynvml_probe_argv(), env={**os.environ, **gs.nvml_env(self.lib, self.config)},
                             capture_output=True, text=True, check=True, timeout=60)
        return gs.parse_probe(out.stdout)


@pytest.fixture
def story(tmp_path, fake_lib, engines):
    d, p = engines
    s = Story(tmp_path, fake_lib, d, p)
    yield s
    d.docker("rm", "-f", "vllm", "eagle3-extract", check=False)


def by_id(report: dict) -> dict[str, dict]:
    return {r["id"]: r for r in report["resources"]}


def done(report: dict) -> list[tuple[str, str, str]]:
    return [(r["id"], a["action"], a["target"]) for r in report["resources"] for a in r.get("actions", ())
            if a.get("result") == "done"]


def test_vllm_container_reported_and_freed_by_stopping_it(story):
    vllm = story.run("vllm", "vllm/vllm-openai:v0.6.3", "unless-stopped", 0)
    extract = story.run("eagle3-extract", cs.IMAGE, "no", 1)
    # What NVML says: the vLLM container's process (a host PID in its cgroup) holds every GPU.
    gpus = story.nvml()
    vllm_pid = cs.host_pid(vllm)
    assert all(vllm_pid in g["pids"] for g in gpus)
    assert vllm["Id"] in Path(f"/proc/{vllm_pid}/cgroup").read_text()
    state = story.state()

    rc, report = story.cli("diff", state)
    assert rc == 2
    r = by_id(report)
    gpus_msg = r["gpus"]["message"]
    # "what took my GPUs, and will it come back?": the container, its image and its policy, as docker says.
    policy = cs.policy(vllm)
    assert (f"{vllm_pid} (sh) in container:vllm (docker, image {vllm['Config']['Image']}, restart {policy})"
            in gpus_msg), gpus_msg
    assert "freed by container:vllm (declared running: false, acted on first)" in gpus_msg
    assert "eagle3-extract" not in gpus_msg  # allowed: not a suspect
    assert [a["action"] for a in r["container:vllm"]["actions"]] == ["update-restart", "stop"]
    assert r["gpus"].get("actions", []) == []  # the GPUs kind signals nothing: the container is stopped

    rc, report = story.cli("apply", state)
    assert rc == 0, report
    assert done(report) == [("container:vllm", "update-restart", "vllm"), ("container:vllm", "stop", "vllm")]
    assert by_id(report)["gpus"]["status"] == "ok"
    seen = story.dockerd.inspect("vllm")
    assert seen["State"]["Running"] is False and cs.policy(seen) == "no"
    left = story.dockerd.inspect("eagle3-extract")  # the allowed container, left alone
    assert left["State"]["Running"] is True and left["State"]["StartedAt"] == extract["State"]["StartedAt"]
    assert cs.host_pid(left) == cs.host_pid(extract)
    gpus = story.nvml()
    assert all(g["pids"] == [cs.host_pid(extract)] and g["used_mib"] == EXTRACT_MIB for g in gpus)

    rc, report = story.cli("apply", state)
    assert rc == 0 and done(report) == []  # apply twice: no action


def test_undeclared_container_is_stopped_through_its_engine(story):
    vllm = story.run("vllm", "vllm/vllm-openai:v0.6.3", "always", 0)
    state = story.state(lambda doc: doc.pop("containers"))
    rc, report = story.cli("diff", state)
    planned = by_id(report)["gpus"]["actions"]
    assert [(a["action"], a["target"]) for a in planned] == [("stop-container", "vllm")]
    assert "policy (always) starts it again when dockerd restarts" in planned[0]["description"]
    rc, report = story.cli("apply", state)
    assert done(report) == [("gpus", "stop-container", "vllm")]
    assert rc == 0, report
    assert story.dockerd.inspect("vllm")["State"]["Running"] is False
    assert not any(g["pids"] for g in story.nvml())
    assert not gs.proc_alive(cs.host_pid(vllm))


def test_a_process_in_a_container_is_never_signalled(story):
    """Even a kill glob that names it (`sh`) does not signal a container's process: with
    stop_containers off the holder is blocked and the container keeps running, same PID."""
    vllm = story.run("vllm", "vllm/vllm-openai:v0.6.3", "always", 0)

    def edit(doc):
        doc.pop("containers")
        doc["gpus"]["free_with"] = {"kill": ["sh", "python*"], "stop_units": True}

    rc, report = story.cli("apply", story.state(edit))
    r = by_id(report)["gpus"]
    assert rc == 2 and r["status"] == "blocked" and done(report) == []
    assert "in container:vllm" in r["message"] and "stop_containers is off" in r["message"]
    seen = story.dockerd.inspect("vllm")
    assert seen["State"]["Running"] is True and cs.host_pid(seen) == cs.host_pid(vllm)
    assert seen["RestartCount"] == vllm["RestartCount"]
