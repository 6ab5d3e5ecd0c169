"""GitOps: the JSON report contract, the printed state schema, the pre-commit hook with the real
pre-commit framework, and the post-merge hook example."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from cli_support import cli_env, reconcile_argv
from gitops_support import REPO, cli, is_active, report_schema, service, validate_report  # noqa: F401

# --- schemas ------------------------------------------------------------------------------


@pytest.mark.pure
def test_report_schema_is_valid_draft_2020_12():
    schema = report_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.pure
def test_printed_state_schema_is_valid_draft_2020_12_and_self_contained(tmp_path):
    proc = subprocess.run(reconcile_argv("schema"), capture_output=True, text=True, env=cli_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    # As an editor uses it: plain jsonschema, no reconcile code, every $ref resolved inside the file.
    from ruamel.yaml import YAML

    validator = jsonschema.Draft202012Validator(schema)
    for path in sorted((REPO / "states").glob("*.yaml")):
        doc = YAML(typ="safe", pure=True).load(path.read_text())  # ruamel's YAML 1.2 parser, not libyaml's 1.1
        assert list(validator.iter_errors(doc)) == [], path
    bad = {"version": 1, "units": {"vllm.service": {"activ": False}}}
    assert [e.validator for e in validator.iter_errors(bad)] == ["additionalProperties"]


@pytest.mark.skipif(Path("/run/systemd/system").exists(), reason="this host runs systemd as PID 1 [ci-ok]")
def test_error_report_validates(tmp_path):
    state = tmp_path / "s.yaml"
    state.write_text("version: 1\nunits:\n  vllm.service:\n    active: false\n")
    for command in ("diff", "apply"):
        args = [command, "--format", "json", str(state)]
        if command == "apply":
            args += ["--journal", str(tmp_path / "journal.jsonl")]
        proc = subprocess.run(reconcile_argv(*args), capture_output=True, text=True, env=cli_env(tmp_path))
        assert proc.returncode == 1
        doc = json.loads(proc.stdout)
        validate_report(doc)
        assert doc["resources"][0]["status"] == "error" and doc["summary"]["error"] == 1


def test_diff_and_apply_reports_validate_on_real_systemd(nsystemd, cli):  # noqa: F811
    nsystemd.write_unit("t-rep-a.service", service("a"), enable=True)
    nsystemd.systemctl("start", "t-rep-a.service", check=True)
    nsystemd.write_unit("t-rep-b.service", service("b"))
    state = cli.state("""version: 1
host: "*"
units:
  t-rep-a.service:
    active: false
    enabled: false
  t-rep-b.service:
    active: true
    needs: [unit:t-rep-a.service]
  t-rep-ghost.service:
    active: true
""")
    runs = []
    for args in (("diff",), ("apply", "--dry-run"), ("apply",), ("apply",)):
        code, doc = cli.json(*args, str(state))
        validate_report(doc)
        runs.append((code, doc))
    (code, diff), _dry, (applied_code, applied), (again_code, again) = runs
    assert code == 2 and {r["status"] for r in diff["resources"]} == {"drift", "blocked"}
    assert diff["host_pattern"] == "*" and diff["resources"][1]["needs"] == ["unit:t-rep-a.service"]
    assert applied_code == 2 and applied["summary"]["actions_done"] == 3  # disable, stop a; start b
    assert [r["status"] for r in applied["resources"]] == ["ok", "ok", "blocked"]
    assert again_code == 2 and again["summary"]["actions_done"] == 0
    assert is_active(nsystemd, "t-rep-a.service") == "inactive" and is_active(nsystemd, "t-rep-b.service") == "active"


# --- the pre-commit hook, with the real pre-commit --------------------------------------------

def _git(*args: str, cwd: Path, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.com",
                           "-c", "init.defaultBranch=main", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, check=check, timeout=300)


def docs_precommit_block() -> list[str]:
    """The failed hook's output as docs/gitops.md shows it: the fenced block that opens with the hook's line."""
    text = (REPO / "docs" / "gitops.md").read_text()
    block = re.search(r"^```\n(reconcile validate\.+Failed\n.*?)^```$", text, re.M | re.S)
    assert block, "docs/gitops.md: no pre-commit output block"
    return block.group(1).rstrip("\n").split("\n")


def _hook_repo(tmp: Path, env: dict) -> tuple[Path, str]:
    """A git repository holding this working tree (committed or not), as pre-commit clones a hook repo."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    dest = tmp / "hook-repo"
    for rel in listed:
        if not rel or rel.split("/", 1)[0] in ("tests", "bench") or not (REPO / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)
    _git("init", "-q", cwd=dest, env=env)
    _git("add", "-A", cwd=dest, env=env)
    _git("commit", "-q", "-m", "hook repo", cwd=dest, env=env)
    return dest, _git("rev-parse", "HEAD", cwd=dest, env=env).stdout.strip()


def _missing_pre_commit() -> str | None:
    if shutil.which("git") is None:
        return "git not installed"
    try:
        import pre_commit  # noqa: F401
    except ImportError:
        return "pre-commit not installed (pip install -e '.[test]')"
    if not (REPO / ".git").exists():
        return "not a git checkout"
    return None


@pytest.mark.skipif(_missing_pre_commit() is not None, reason=str(_missing_pre_commit()))
def test_pre_commit_hook_blocks_a_bad_state_file(tmp_path):
    env = {**os.environ,
           "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
           "RECONCILE_CACHE_DIR": str(tmp_path / "cache"),
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           # Offline and fast: the hook's virtualenv sees the packages this Python has installed, and pip
           # installs reconcile itself from the cloned hook repository, building it with the setuptools
           # that virtualenv seeds (no index, no isolated build environment to download).
           "VIRTUALENV_SYSTEM_SITE_PACKAGES": "1", "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0"}
    if sys.prefix != sys.base_prefix:
        # Run from a virtual environment (as the README's commands do): the hook's virtualenv is made
        # from the base interpreter, whose site-packages lack our dependencies, so it is shown this
        # environment's site-packages the one way pip and the hook both honour.
        import sysconfig

        env["PYTHONPATH"] = os.pathsep.join(p for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib"),
                                                        env.get("PYTHONPATH")) if p)
    hook_repo, rev = _hook_repo(tmp_path, env)
    project = tmp_path / "gpu-hosts"
    (project / "states").mkdir(parents=True)
    _git("init", "-q", cwd=project, env=env)
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hook_repo}\n    rev: {rev}\n    hooks:\n      - id: reconcile-validate\n")
    installed = subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=project, env=env,
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    (project / "states" / "kpro6.yaml").write_text(
        "version: 1\nunits:\n  vllm-kimi-k25-int4.service:\n    activ: false\n")
    (project / "notes.yaml").write_text(": not a state file, not checked\n")
    _git("add", "-A", cwd=project, env=env)
    bad = _git("commit", "-m", "stop vllm", cwd=project, env=env, check=False)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0, out
    assert "reconcile validate" in out and "Failed" in out
    assert ("states/kpro6.yaml:4:5: units.\"vllm-kimi-k25-int4.service\": unknown key 'activ' "
            "(did you mean 'active'?)") in out
    assert "notes.yaml" not in out
    # docs/gitops.md shows this output: its lines are pre-commit's, in order, the duration's number aside.
    shown = docs_precommit_block()
    printed = [line.rstrip() for line in out.splitlines()]
    start = printed.index(shown[0])
    assert [re.sub(r"^- duration: [0-9.]+s$", "- duration: Ns", line) for line in printed[start:start + len(shown)]] \
        == [re.sub(r"^- duration: [0-9.]+s$", "- duration: Ns", line) for line in shown], (shown, out)
    assert _git("rev-parse", "-q", "--verify", "HEAD", cwd=project, env=env, check=False).returncode != 0

    (project / "states" / "kpro6.yaml").write_text(
        "version: 1\nunits:\n  vllm-kimi-k25-int4.service:\n    active: false\n")
    _git("add", "-A", cwd=project, env=env)
    good = _git("commit", "-m", "stop vllm", cwd=project, env=env, check=False)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "reconcile validate" in good.stdout + good.stderr and "Passed" in good.stdout + good.stderr

    # An old spelling (docs/state-file.md#old-spellings) passes, and the hook shows its warning.
    (project / "states" / "kpro6.yaml").write_text(
        "version: 1\nextractions:\n  hs:\n    dir: /data/hs\n    total: 10\n    verify: all\n")
    _git("add", "-A", cwd=project, env=env)
    old = _git("commit", "-m", "check every byte", cwd=project, env=env, check=False)
    out = old.stdout + old.stderr
    assert old.returncode == 0 and "Passed" in out, out
    assert "states/kpro6.yaml:6:13: warning: extractions.hs.verify: 'all' is a deprecated spelling: write 'content'" \
        in out


# --- the post-merge hook example ---------------------------------------------------------------

def test_post_merge_hook_applies_the_pulled_state(nsystemd, cli):  # noqa: F811
    env = {**cli_env(cli.tmp), "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
           "RECONCILE": f"{sys.executable} -m reconcile_host",
           "RECONCILE_APPLY_ARGS": f"--journal {cli.journal}"}
    nsystemd.set_hostname("kpro6-ct129")
    nsystemd.write_unit("t-pm.service", service("pm"))
    nsystemd.systemctl("start", "t-pm.service", check=True)
    origin, clone = cli.tmp / "origin", cli.tmp / "clone"
    (origin / "states").mkdir(parents=True)
    (origin / "states" / "kpro6-ct129.yaml").write_text("version: 1\nunits:\n  t-pm.service:\n    active: true\n")
    _git("init", "-q", cwd=origin, env=env)
    _git("add", "-A", cwd=origin, env=env)
    _git("commit", "-q", "-m", "initial", cwd=origin, env=env)
    _git("clone", "-q", str(origin), str(clone), cwd=cli.tmp, env=env)
    shutil.copy2(REPO / "contrib" / "post-merge", clone / ".git" / "hooks" / "post-merge")

    (origin / "states" / "kpro6-ct129.yaml").write_text("version: 1\nunits:\n  t-pm.service:\n    active: false\n")
    _git("commit", "-q", "-am", "stop t-pm", cwd=origin, env=env)
    # The pull runs in the namespace, where the host name and systemd are the test's.
    pulled = nsystemd.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "pull", "-q", "--no-rebase"],
                          cwd=str(clone), env=env)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    out = pulled.stdout + pulled.stderr  # git gives hooks its stderr as their stdout
    assert "post-merge: reconcile apply states/kpro6-ct129.yaml" in out
    assert "post-merge: kpro6-ct129 matches states/kpro6-ct129.yaml" in out
    assert is_active(nsystemd, "t-pm.service") == "inactive"
    assert [e["action"] for e in map(json.loads, cli.journal.read_text().splitlines()) if e["event"] == "result"] == [
        "stop"]
