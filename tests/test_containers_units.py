"""Containers a systemd unit runs: acted on through the unit, never fought. A real dockerd (outside)
and a unit of the namespaced systemd (tests/nsystemd.py) that runs `docker run --rm` attached,
with Restart=always, as many hosts run vLLM. Checked with `systemctl` and `docker inspect`."""

from __future__ import annotations

import json
import uuid

import container_support as cs
import pytest
from cli_support import NsCli, is_active

REASON = cs.missing(cs.DOCKERD, cs.DOCKER, cs.PODMAN)
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
UNIT = "vllm-container.service"


@pytest.fixture(scope="module")
def engines():
    d = cs.Dockerd().start()
    d.import_image()
    p = cs.Podman()
    yield d, p
    d.close()
    p.close()


def unit_text(dockerd, name: str) -> str:
    env = " ".join(f"{k}={v}" for k, v in dockerd.env().items() if k != "PATH")
    return (f"[Service]\nEnvironment={env}\nExecStart={cs.DOCKER} run --rm --name {name} --network none "
            f"{cs.IMAGE} /bin/sh -c \"trap 'exit 0' TERM; while :; do sleep 1; done\"\n"
            "Restart=always\nRestartSec=100ms\n[Install]\nWantedBy=multi-user.target\n")


def running(dockerd, name: str):
    """The container by that name if it runs, from one `docker inspect` (the unit's `--rm` container
    may be removed between two calls while systemd starts the next: no such container is "not yet")."""
    seen = dockerd.seen(name)
    return seen if seen is not None and seen["State"]["Running"] else None


@pytest.fixture
def scene(nsystemd, engines, tmp_path):
    dockerd, podman = engines
    name = f"vllm-{uuid.uuid4().hex[:8]}"
    nsystemd.write_unit(UNIT, unit_text(dockerd, name), enable=True)
    nsystemd.systemctl("start", UNIT, check=True)
    first = cs.wait_for("the unit's container", lambda: running(dockerd, name))
    cli = NsCli(nsystemd, tmp_path)
    yield nsystemd, dockerd, podman, cli, name, first
    nsystemd.systemctl("stop", UNIT)
    dockerd.docker("rm", "-f", name, check=False)


def reconcile(cli, dockerd, podman, state: str, *args: str):
    path = cli.state("version: 1\n" + state)
    proc = cli(*(args or ("apply",)), str(path), "--format", "json", **{**dockerd.env(), **podman.env()})
    assert "Traceback" not in proc.stderr and proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_stopping_the_container_alone_is_undone_by_the_unit(scene):
    """The engine's and systemd's truth: `docker stop` ends the unit's `docker run`, and
    Restart=always starts a new container — why reconcile goes through the unit."""
    nsd, dockerd, podman, cli, name, first = scene
    dockerd.docker("stop", "-t", "5", name)
    again = cs.wait_for("a new container", lambda: (i := running(dockerd, name)) and i["Id"] != first["Id"] and i)
    assert again["Id"] != first["Id"] and is_active(nsd, UNIT) == "active"


def test_a_unit_run_container_is_stopped_through_its_unit(scene):
    nsd, dockerd, podman, cli, name, first = scene
    state = f"containers:\n  {name}:\n    unit: {UNIT}\n    running: false\n"
    rc, report = reconcile(cli, dockerd, podman, state, "diff")
    r = next(x for x in report["resources"] if x["id"] == f"container:{name}")
    assert rc == 2 and [(a["action"], a["target"]) for a in r["actions"]] == [("stop-unit", UNIT)], r
    rc, report = reconcile(cli, dockerd, podman, state)
    assert rc == 0, report
    assert is_active(nsd, UNIT) == "inactive"  # systemd's word
    said = dockerd.docker("inspect", "--type", "container", name, check=False)  # --rm: gone, and not back
    assert said.returncode != 0 and "No such container" in said.stderr
    rc, report = reconcile(cli, dockerd, podman, state)
    assert rc == 0 and not any(a.get("result") == "done" for x in report["resources"] for a in x.get("actions", ()))


def test_a_declared_unit_does_the_work(scene):
    nsd, dockerd, podman, cli, name, first = scene
    state = (f"units:\n  {UNIT}:\n    active: false\n    enabled: false\n"
             f"containers:\n  {name}:\n    unit: {UNIT}\n    running: false\n")
    rc, report = reconcile(cli, dockerd, podman, state, "diff")
    r = next(x for x in report["resources"] if x["id"] == f"container:{name}")
    assert not r.get("actions") and f"acted on through unit:{UNIT}" in r["message"]
    rc, report = reconcile(cli, dockerd, podman, state)
    assert rc == 0, report
    assert is_active(nsd, UNIT) == "inactive" and nsd.systemctl("is-enabled", UNIT).stdout.strip() == "disabled"
    assert not running(dockerd, name)
