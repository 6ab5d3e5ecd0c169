"""The Ansible collection (contrib/ansible/) as users get it: built with `ansible-galaxy
collection build`, installed with `ansible-galaxy collection install`, documented by
`ansible-doc`, checked by `ansible-test sanity`, and run by the real `ansible-playbook`
(ansible-core from pip) over the loopback sshd against three targets: two namespaced systemds
(one drifted, one converged) and one unreachable. What the targets' units are afterwards is
asked of systemctl in their namespaces."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
from cli_support import service
from nsystemd import NamespacedSystemd
from ssh_support import free_port, sshd  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parent.parent
COLLECTION_SRC = ROOT / "contrib" / "ansible"
ROLLING = ROOT / "docs" / "examples" / "rolling-recovery.yml"
BIN = Path(sys.executable).parent
UNIT = "ansible-target.service"

ansible_missing = not (BIN / "ansible-playbook").exists()
pytestmark = pytest.mark.skipif(ansible_missing, reason="ansible-core not installed (pip: the test extra)")

# What ansible-test downloads first (get-pip from ci-files.testing.ansible.com, out of reach
# here) replaced by the standard library's ensurepip; ansible-test uses a cached script when
# ~/.ansible/test/cache/get_pip_<version>.py exists (ansible_test/_util/target/setup/requirements.py,
# bootstrap). ensurepip sets PIP_CONFIG_FILE=/dev/null, which would hide the machine's pip.conf.
GET_PIP_STAND_IN = '''\
import ensurepip, os, runpy, sys
ensurepip.bootstrap()
os.environ.pop("PIP_CONFIG_FILE", None)
sys.argv = ["pip", "install"] + [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
'''


def tool(name: str) -> str:
    return str(BIN / name)


# --- the collection, built and installed ---------------------------------------------------

@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    """Build the tarball, install it into a collections path of its own; return that path."""
    work = tmp_path_factory.mktemp("collection")
    build = subprocess.run([tool("ansible-galaxy"), "collection", "build", str(COLLECTION_SRC), "--output-path",
                            str(work)], capture_output=True, text=True, timeout=120, cwd=work)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = work.glob("reconcile-host-*.tar.gz")
    install = subprocess.run([tool("ansible-galaxy"), "collection", "install", "-p", str(work / "coll"),
                              str(tarball)], capture_output=True, text=True, timeout=120, cwd=work)
    assert install.returncode == 0, install.stdout + install.stderr
    assert (work / "coll" / "ansible_collections" / "reconcile" / "host" / "plugins" / "modules" / "state.py").exists()
    return work / "coll"


def ansible_env(tmp: Path, collections: Path, **extra: str) -> dict[str, str]:
    home = tmp / "ansible-home"
    home.mkdir(exist_ok=True)
    (tmp / "ansible.cfg").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(tmp / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(collections),
               ANSIBLE_HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_REMOTE_TEMP=str(tmp / "remote"),
               ANSIBLE_SSH_CONTROL_PATH_DIR=str(home / "cp"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_STDOUT_CALLBACK="default", ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_TIMEOUT="10",
               PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}", **extra)
    return env


def test_ansible_doc_shows_the_module(tmp_path, collection):
    proc = subprocess.run([tool("ansible-doc"), "--json", "reconcile.host.state"], capture_output=True, text=True,
                          timeout=120, env=ansible_env(tmp_path, collection))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)["reconcile.host.state"]
    options = doc["doc"]["options"]
    assert set(options) == {"src", "content", "state_label", "journal", "lock_timeout", "executable",
                            "fail_on_blocked"}
    assert options["executable"]["default"] == "reconcile" and options["fail_on_blocked"]["default"] is True
    assert {"report", "not_ok", "rc", "stderr", "cmd"} <= set(doc["return"])
    assert "reconcile.host.state:" in doc["examples"]
    text = subprocess.run([tool("ansible-doc"), "reconcile.host.state"], capture_output=True, text=True,
                          timeout=120, env=ansible_env(tmp_path, collection))
    assert text.returncode == 0 and "reconcile apply --format json -" in text.stdout, text.stderr


def test_ansible_test_sanity_accepts_the_collection(tmp_path, collection):
    """All of ansible-test's sanity tests (--local: no containers) on the installed collection.
    Its per-test virtual environments are kept in a HOME under /tmp between runs."""
    from ansible import __version__ as ansible_version
    from ansible_test._internal.python_requirements import get_venv_packages

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    home = Path("/tmp") / f"reconcile-ansible-test-{ansible_version}"
    pip_version = get_venv_packages(types.SimpleNamespace(version=python))["pip"]
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / f"get_pip_{pip_version.replace('.', '_')}.py").write_text(GET_PIP_STAND_IN)
    # ansible-test wants to run from the collection's own directory, and it writes there: a copy.
    work = tmp_path / "ansible_collections" / "reconcile" / "host"
    shutil.copytree(collection / "ansible_collections" / "reconcile" / "host", work)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "PIP_"))}
    env.update(HOME=str(home), PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}")
    proc = subprocess.run([tool("ansible-test"), "sanity", "--python", python, "--local", "--color", "no"],
                          capture_output=True, text=True, timeout=900, cwd=work, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ran = set(re.findall(r'Running sanity test "([a-z0-9-]+)"', proc.stdout + proc.stderr))
    assert {"validate-modules", "ansible-doc", "pylint", "pep8", "import", "compile", "yamllint",
            "action-plugin-docs"} <= ran, ran


# --- three targets ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def second_systemd():
    why = NamespacedSystemd.missing_prerequisites()
    if why:
        pytest.skip(f"namespaced systemd unavailable: {why}")
    with NamespacedSystemd("reconcile-ansible") as nsd:
        yield nsd


STATE_TEMPLATE = """\
version: 1
units:
  {{ reconcile_unit }}:
    active: {{ reconcile_active | default('false') }}
    enabled: false
"""

PLAYBOOK = """\
- hosts: targets
  gather_facts: false
  tasks:
    - name: converge
      reconcile.host.state:
        src: state.yaml.j2
        executable: "{{ reconcile_executable }}"
        # One directory per target: the apply lock sits beside the journal, and these targets
        # share one file system (on real hosts each has its own).
        journal: "{{ journal_dir }}/{{ inventory_hostname }}/journal.jsonl"
"""


class Fleet:
    """An inventory of the three targets, a playbook and a templated state, and how to run them."""

    def __init__(self, tmp: Path, server, collections: Path, drifted: NamespacedSystemd,
                 converged: NamespacedSystemd):
        self.tmp, self.server, self.collections = tmp, server, collections
        self.drifted, self.converged = drifted, converged
        (tmp / "templates").mkdir()
        (tmp / "templates" / "state.yaml.j2").write_text(STATE_TEMPLATE)
        (tmp / "site.yml").write_text(PLAYBOOK)
        self.journals = tmp / "journals"
        self.journals.mkdir()

    def executable(self, nsd: NamespacedSystemd) -> str:
        return (f"nsenter -t {nsd.pid} -m -p -u env RECONCILE_CACHE_DIR={self.tmp / 'cache'} "
                f"RECONCILE_STATE_DIR={self.tmp / 'state'} {sys.executable} -m reconcile_host")

    def inventory(self, groups: dict[str, list[str]]) -> Path:
        known_hosts = self.tmp / "known_hosts"
        common = {"ansible_host": "127.0.0.1", "ansible_port": self.server.port, "ansible_user": "root",
                  "ansible_connection": "ssh", "ansible_python_interpreter": sys.executable,
                  "ansible_ssh_private_key_file": str(self.server.dir / "client_key"),
                  "ansible_ssh_common_args": f"-o IdentitiesOnly=yes -o UserKnownHostsFile={known_hosts} "
                                             "-o StrictHostKeyChecking=accept-new -o ControlMaster=no",
                  "journal_dir": str(self.journals), "reconcile_unit": UNIT}
        hosts = {
            "drifted": {"reconcile_executable": self.executable(self.drifted)},
            "converged": {"reconcile_executable": self.executable(self.converged)},
            "unreachable": {"ansible_port": free_port(), "reconcile_executable": "reconcile"},
            # The converged target's systemd, asked to start a unit that does not exist: blocked.
            "blocked": {"reconcile_executable": self.executable(self.converged),
                        "reconcile_unit": "ansible-absent.service", "reconcile_active": "true"},
        }
        doc = {"all": {"vars": common, "hosts": hosts,
                       "children": {g: {"hosts": {h: None for h in members}} for g, members in groups.items()}}}
        path = self.tmp / "hosts.yaml"
        path.write_text(json.dumps(doc, indent=2))  # JSON is YAML
        return path

    def playbook(self, *args: str, groups: dict[str, list[str]] | None = None, playbook: str = "site.yml",
                 timeout: float = 300) -> subprocess.CompletedProcess:
        inventory = self.inventory(groups or {"targets": ["drifted", "converged", "unreachable"]})
        return subprocess.run([tool("ansible-playbook"), "-i", str(inventory), playbook, *args],
                              capture_output=True, text=True, timeout=timeout, cwd=self.tmp,
                              env=ansible_env(self.tmp, self.collections))


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP: host -> {ok, changed, unreachable, failed, ...}."""
    tail = output.split("PLAY RECAP", 1)[1]
    found = {}
    for line in tail.splitlines():
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line)
        if m:
            found[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return found


def unit_state(nsd: NamespacedSystemd, unit: str = UNIT) -> tuple[str, str]:
    return (nsd.systemctl("is-active", unit).stdout.strip(), nsd.systemctl("is-enabled", unit).stdout.strip())


@pytest.fixture
def fleet(tmp_path, sshd, collection, nsystemd, second_systemd):  # noqa: F811
    """`drifted`: the session's namespaced systemd with UNIT running and enabled; `converged`:
    a second one with UNIT stopped and disabled, as the state wants."""
    nsystemd.write_unit(UNIT, service(UNIT), enable=True)
    nsystemd.systemctl("start", UNIT, check=True)
    second_systemd.write_unit(UNIT, service(UNIT))
    assert unit_state(nsystemd) == ("active", "enabled")
    assert unit_state(second_systemd) == ("inactive", "disabled")
    yield Fleet(tmp_path, sshd, collection, nsystemd, second_systemd)
    second_systemd.reset()


def test_check_mode_with_diff_shows_the_drift_and_changes_nothing(fleet):
    proc = fleet.playbook("--check", "--diff")
    out = proc.stdout
    assert proc.returncode == 4, out + proc.stderr  # 4: a host was unreachable
    assert recap(out) == {
        "drifted": {"ok": 1, "changed": 1, "unreachable": 0, "failed": 0, "skipped": 0, "rescued": 0, "ignored": 0},
        "converged": {"ok": 1, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 0, "rescued": 0, "ignored": 0},
        "unreachable": {"ok": 0, "changed": 0, "unreachable": 1, "failed": 0, "skipped": 0, "rescued": 0,
                        "ignored": 0},
    }, out
    # Ansible's before/after of the drifted host: one line per field, the host's then the state's.
    assert f"--- before: unit:{UNIT} (the host)\n+++ after: unit:{UNIT} (the state)\n" in out
    assert "-active: true\n-enabled: true\n+active: false\n+enabled: false\n" in out
    # Nothing changed, as systemd in the namespace says; no journal written.
    assert unit_state(fleet.drifted) == ("active", "enabled")
    assert list(fleet.journals.iterdir()) == []


def test_apply_converges_the_drifted_host_and_a_second_run_changes_nothing(fleet):
    proc = fleet.playbook("--diff")
    out = proc.stdout
    assert proc.returncode == 4, out + proc.stderr
    counts = recap(out)
    assert (counts["drifted"]["changed"], counts["drifted"]["failed"]) == (1, 0), out
    assert (counts["converged"]["ok"], counts["converged"]["changed"]) == (1, 0)
    assert counts["unreachable"]["unreachable"] == 1
    assert "-active: true\n-enabled: true\n+active: false\n+enabled: false\n" in out  # --diff: what was changed
    assert unit_state(fleet.drifted) == ("inactive", "disabled")
    journal = [json.loads(line) for line in (fleet.journals / "drifted" / "journal.jsonl").read_text().splitlines()]
    assert sorted((e["action"], e["result"]) for e in journal if e["event"] == "result") == [
        ("disable", "done"), ("stop", "done")]
    assert not (fleet.journals / "converged" / "journal.jsonl").exists()

    again = fleet.playbook("-v")
    counts = recap(again.stdout)
    assert counts["drifted"]["changed"] == 0 and counts["drifted"]["ok"] == 1
    assert '"msg": "0 action(s) done; 1 resource(s) ok"' in again.stdout


def test_serial_rollout_stops_at_the_first_host_that_stays_blocked(fleet):
    """docs/examples/rolling-recovery.yml: the blocked host comes first; the drifted one is never touched."""
    proc = fleet.playbook("-e", f"reconcile_state={fleet.tmp / 'templates' / 'state.yaml.j2'}",
                          "-e", "reconcile_hosts=rollout", "-e", "reconcile_gate_retries=1",
                          "-e", "reconcile_gate_delay=0", "-e", f"reconcile_journal={fleet.journals}/j.jsonl",
                          groups={"rollout": ["blocked", "drifted"]}, playbook=str(ROLLING))
    out = proc.stdout
    assert proc.returncode == 2, out + proc.stderr
    counts = recap(out)
    assert counts == {"blocked": {"ok": 0, "changed": 0, "unreachable": 0, "failed": 1, "skipped": 0,
                                  "rescued": 0, "ignored": 0}}
    assert "FAILED - RETRYING" in out  # the health gate gave it another chance
    assert "not ok: unit:ansible-absent.service: blocked (unit ansible-absent.service not found" in out
    assert "NO MORE HOSTS LEFT" in out
    assert unit_state(fleet.drifted) == ("active", "enabled")  # the rollout never reached it


def own_files(tmp: Path) -> str:
    """reconcile on the target behind sshd, which passes no environment: its state and cache
    named on its command line (`env`), in the test's folder, not the machine's /var/lib/reconcile."""
    return (f"env RECONCILE_STATE_DIR={tmp / 'state'} RECONCILE_CACHE_DIR={tmp / 'cache'} "
            f"{sys.executable} -m reconcile_host")


def test_a_missing_reconcile_and_a_bad_state_file_are_one_clear_failure_each(tmp_path, sshd, collection):  # noqa: F811
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "bad.yaml.j2").write_text("version: 1\nunits:\n  {{ unit }}:\n    activ: false\n")
    (tmp_path / "p.yml").write_text(
        "- hosts: t\n  gather_facts: false\n  vars: {unit: x.service}\n  tasks:\n"
        "    - reconcile.host.state: {content: 'version: 1', executable: reconcile-not-installed}\n"
        "      ignore_errors: true\n"
        f"    - reconcile.host.state: {{src: bad.yaml.j2, executable: '{own_files(tmp_path)}'}}\n")
    (tmp_path / "hosts.yaml").write_text(json.dumps({"all": {"hosts": {"t": {
        "ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": "root",
        "ansible_python_interpreter": sys.executable,
        "ansible_ssh_private_key_file": str(sshd.dir / "client_key"),
        "ansible_ssh_common_args": f"-o IdentitiesOnly=yes -o UserKnownHostsFile={tmp_path / 'kh'} "
                                   "-o StrictHostKeyChecking=accept-new"}}}}))
    proc = subprocess.run([tool("ansible-playbook"), "-i", "hosts.yaml", "p.yml"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=ansible_env(tmp_path, collection))
    assert proc.returncode == 2, proc.stdout
    assert ("reconcile-not-installed not found on the target: install reconcile there (not on PyPI: pip install "
            "the wheel `pip wheel --no-deps` builds from a checkout, or 'reconcile-host @ git+URL'), "
            "or set executable") in proc.stdout
    # The template was rendered on the controller ({{ unit }}); reconcile's own message points
    # into the user's file by its name.
    assert ('"msg": "reconcile apply exited 1: bad.yaml.j2:4:5: units.\\"x.service\\": unknown key '
            "'activ' (did you mean 'active'?)\"") in proc.stdout, proc.stdout
    assert recap(proc.stdout)["t"]["failed"] == 1 and recap(proc.stdout)["t"]["ignored"] == 1


def test_a_refusal_is_read_from_the_report_with_its_reason(tmp_path, sshd, collection):  # noqa: F811
    """The target's apply lock is held (a real flock, held by this test): the module's failure
    is reconcile's own line, read from its error report, and `reason` says lock-held."""
    from reconcile_host.pipeline.journal import Journal, Lock

    journal = tmp_path / "target" / "journal.jsonl"
    journal.parent.mkdir()
    (tmp_path / "p.yml").write_text(
        "- hosts: t\n  gather_facts: false\n  tasks:\n"
        f"    - reconcile.host.state: {{content: 'version: 1', journal: '{journal}', "
        f"executable: '{own_files(tmp_path)}'}}\n"
        "      register: r\n      ignore_errors: true\n"
        "    - debug: {msg: 'REASON={{ r.reason }} REPORT={{ r.report.error.reason }}'}\n")
    (tmp_path / "hosts.yaml").write_text(json.dumps({"all": {"hosts": {"t": {
        "ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": "root",
        "ansible_python_interpreter": sys.executable,
        "ansible_ssh_private_key_file": str(sshd.dir / "client_key"),
        "ansible_ssh_common_args": f"-o IdentitiesOnly=yes -o UserKnownHostsFile={tmp_path / 'kh'} "
                                   "-o StrictHostKeyChecking=accept-new"}}}}))
    lock = Lock(Journal.at(str(journal)).lock_path)
    lock.acquire()
    with lock:
        proc = subprocess.run([tool("ansible-playbook"), "-i", "hosts.yaml", "p.yml"], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path, env=ansible_env(tmp_path, collection))
    assert proc.returncode == 0, proc.stdout  # the failure was ignored, the debug task ran
    assert f'"msg": "reconcile apply exited 1: another reconcile apply holds {lock.path}: pid {os.getpid()}' \
        in proc.stdout, proc.stdout
    assert "REASON=lock-held REPORT=lock-held" in proc.stdout, proc.stdout
