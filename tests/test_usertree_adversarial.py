"""A local user who owns a declared `checkpoints.dir` or `extractions.dir` (and nothing else) against
the real CLI running as root: links planted at the pointer file, the quarantine folder, a sample
folder; a FIFO and a link to /dev/zero as the pointer; a helper of that user re-planting links in a
loop while `apply` and `diff` run.

Each test asserts what must hold whatever the timing: nothing outside the tree changed (a root-only
0600 secret and a root-owned target file byte-identical, a root-only folder's listing unchanged),
the secret's text in no report, stderr or journal, no traceback, and the resource `error` or
`blocked` with one clear line where the attack is certain to be met.

The user is a spare uid with no account (setpriv --reuid/--regid --clear-groups): it owns the tree
and runs the planting code itself, so every link it plants is its own, as an attacker's would be.
The temporary base is 0755 so that uid can reach its tree."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from cli_support import reconcile_json
from extraction_support import age, state_yaml, write_samples
from torch_support import need, torch_python

pytestmark = [pytest.mark.system,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                 reason="needs root and setpriv (util-linux): a second user prepares the tree")]

SECRET = b"SECRET-ROOT-ONLY-7f3a9c\n"
TARGET = b"root:x:0:0:the target reconcile must never write:/root:/bin/sh\n"
TRACKER = "latest_checkpointed_iteration.txt"
QUARANTINE = ".reconcile-quarantine"
USER_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")


def _spare_uid() -> int:
    for uid in range(64917, 65000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    pytest.skip("no spare uid without an account in 64917..64999")


UID = _spare_uid()


def as_user(code: str, *args: str, cwd: Path, background: bool = False):
    argv = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", USER_PYTHON, "-c", code, *args]
    if background:
        return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


class Scene:
    """The temporary base (0755), a root-only folder with a secret and a target, the user's tree."""

    def __init__(self, base: Path):
        self.base = base
        self.root_only = base / "root-only"
        self.root_only.mkdir(mode=0o700)
        self.secret = self.root_only / "secret"
        self.secret.write_bytes(SECRET)
        os.chmod(self.secret, 0o600)
        self.target = base / "target"  # reachable by name, root's: what a planted link would name
        self.target.write_bytes(TARGET)
        os.chmod(self.target, 0o644)
        self.reports = base / "reports"
        self.reports.mkdir(mode=0o700)

    def give(self, tree: Path) -> None:
        for p in [tree, *tree.rglob("*")]:
            os.chown(p, UID, UID, follow_symlinks=False)

    def outside(self) -> dict[str, bytes]:
        return {"secret": self.secret.read_bytes(), "target": self.target.read_bytes(),
                "root-only": "\n".join(sorted(os.listdir(self.root_only))).encode()}

    def intact(self, before: dict[str, bytes]) -> None:
        assert self.outside() == before
        assert self.secret.stat().st_uid == 0 and self.target.stat().st_uid == 0

    def cli(self, *args: str, timeout: float = 300):
        run = reconcile_json(self.reports, *args, timeout=timeout)  # asserts: no traceback on stderr
        journal = self.reports / "journal.jsonl"
        seen = (json.dumps(run.doc) if run.doc else "") + run.stderr + (journal.read_text() if journal.exists() else "")
        assert SECRET.decode().strip() not in seen and "the target reconcile" not in seen
        return run


@pytest.fixture
def host():
    base = Path(tempfile.mkdtemp(prefix="reconcile-adversary-"))
    os.chmod(base, 0o755)
    try:
        yield Scene(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def megatron_template(tmp_path_factory):
    """A Megatron run made by torch.save: iterations 4 and 8, the tracker naming 8."""
    python = need(torch_python(), "torch interpreter")
    run = tmp_path_factory.mktemp("megatron") / "run"
    code = ("import torch, sys, os\n"
            "for it in (4, 8):\n"
            "    d = os.path.join(sys.argv[1], f'iter_{it:07d}', 'mp_rank_00'); os.makedirs(d)\n"
            "    sd = {'iteration': it, 'model': {'w': torch.randn(256)}}\n"
            "    torch.save(sd, os.path.join(d, 'model_optim_rng.pt'))\n"
            f"open(os.path.join(sys.argv[1], '{TRACKER}'), 'w').write('8')\n")
    subprocess.run([python, "-c", code, str(run)], check=True, timeout=300)
    return run


def megatron(host: Scene, template: Path, torn: bool) -> tuple[Path, Path]:
    run = host.base / "run"
    shutil.copytree(template, run, symlinks=True)
    if torn:  # the newest iteration cut off mid-write: apply quarantines it and points the tracker at 4
        p = run / "iter_0000008" / "mp_rank_00" / "model_optim_rng.pt"
        os.truncate(p, p.stat().st_size // 2)
    host.give(run)
    state = host.reports / "ckpt.yaml"
    state.write_text(f"version: 1\ncheckpoints:\n  mega:\n    dir: {run}\n    layout: megatron\n")
    return run, state


def only(run) -> dict:
    (res,) = run.doc["resources"]
    return res


def refused(res: dict, *words: str) -> None:
    text = res.get("message", "") + json.dumps(res.get("drift", "")) + json.dumps(res.get("actions", ""))
    assert res["status"] in ("error", "blocked"), res
    assert any(w in text for w in words), res


@pytest.mark.parametrize("plant", ["link-to-secret", "fifo", "link-to-dev-zero"])
def test_a_tracker_that_is_not_a_small_regular_file_is_refused(host, megatron_template, plant):
    run, state = megatron(host, megatron_template, torn=False)
    before = host.outside()
    as_user("import os, sys\n"
            "t = sys.argv[1]; os.unlink(t)\n"
            "if sys.argv[2] == 'fifo': os.mkfifo(t)\n"
            "else: os.symlink(sys.argv[3], t)\n",
            str(run / TRACKER), plant, "/dev/zero" if plant == "link-to-dev-zero" else str(host.secret), cwd=host.base)
    for args in (("diff", "-v", str(state)), ("apply", str(state))):
        res = only(host.cli(*args))
        refused(res, TRACKER)
        assert "refused" in res.get("message", "") + json.dumps(res), res
    host.intact(before)
    assert os.path.islink(run / TRACKER) or (run / TRACKER).is_fifo()


@pytest.mark.parametrize("plant", ["link-to-root-folder", "users-own-folder"])
def test_a_planted_quarantine_folder_is_refused_and_nothing_moves(host, megatron_template, plant):
    run, state = megatron(host, megatron_template, torn=True)
    before = host.outside()
    as_user("import os, sys\n"
            "q = os.path.join(sys.argv[1], '.reconcile-quarantine')\n"
            "os.symlink(sys.argv[3], q) if sys.argv[2] == 'link-to-root-folder' else os.mkdir(q, 0o777)\n"
            "os.chmod(q, 0o777) if sys.argv[2] != 'link-to-root-folder' else None\n",
            str(run), plant, str(host.root_only), cwd=host.base)
    res = only(host.cli("apply", str(state)))
    refused(res, QUARANTINE)
    host.intact(before)
    assert (run / "iter_0000008" / "mp_rank_00" / "model_optim_rng.pt").exists()  # not moved anywhere
    assert (run / TRACKER).read_text() == "8"


RACER = """
import os, sys, time
run, secret, target, root_only, until = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
tracker = os.path.join(run, 'latest_checkpointed_iteration.txt')
q = os.path.join(run, '.reconcile-quarantine')
def plant(src, dst):
    tmp = dst + '.plant'
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(src, tmp)
    os.rename(tmp, dst)
n = 0
while time.time() < until:
    n += 1
    # the old predictable temporary names (.NAME.reconcile-PID.tmp) for every live pid
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            for name in ('latest_checkpointed_iteration.txt', 'last.ckpt', 'manifest.json'):
                try:
                    os.symlink(target, os.path.join(run, f'.{name}.reconcile-{pid}.tmp'))
                except OSError:
                    pass
    # the tracker: a link to the secret, then a regular file again
    if n % 2:
        plant(secret, tracker)
    else:
        with open(tracker + '.w', 'w') as fh:
            fh.write('8')
        os.rename(tracker + '.w', tracker)
    # the quarantine folder: a link to root's folder, or gone (so that root makes it, then swapped)
    try:
        if os.path.islink(q) or not os.path.exists(q):
            plant(root_only, q)
        else:
            os.rename(q, q + '.%d' % n)
            plant(root_only, q)
    except OSError:
        pass
"""


def test_a_racing_user_moves_or_writes_nothing_outside_the_tree(host, megatron_template):
    run, state = megatron(host, megatron_template, torn=True)
    before = host.outside()
    base_names = sorted(os.listdir(host.base))
    racer = as_user(RACER, str(run), str(host.secret), str(host.target), str(host.root_only),
                    str(time.time() + 600), cwd=host.base, background=True)
    try:
        time.sleep(0.5)
        assert racer.poll() is None, racer.stderr.read().decode()
        for args in (("apply", str(state)), ("diff", "-v", str(state)), ("apply", str(state)), ("apply", str(state))):
            res = only(host.cli(*args))
            assert res["status"] in ("ok", "drift", "error", "blocked"), res
            assert "\n" not in res.get("message", ""), res
    finally:
        racer.kill()
        racer.wait()
    host.intact(before)
    assert sorted(os.listdir(host.base)) == base_names
    # whatever reconcile created in the tree is root's 0600/0700 or the user's own, never a link it followed
    for p in run.rglob("*"):
        if p.is_symlink():
            assert os.lstat(p).st_uid == UID, p  # only the user's own links


def test_an_extraction_folder_that_is_a_link_is_never_walked_or_moved_from(host):
    out = host.base / "hs"
    write_samples(out, range(20), group=10)
    victim = host.root_only / "victim"  # another user's damaged samples, in a root-only folder
    write_samples(victim, range(10, 20), group=10, cut=10)
    victims = sorted(str(p.relative_to(victim)) for p in victim.rglob("*"))
    host.give(out)
    before = host.outside()
    as_user("import os, shutil, sys\n"
            "d = os.path.join(sys.argv[1], 'rows_10-20'); shutil.rmtree(d)\n"
            "os.symlink(os.path.join(sys.argv[2], 'rows_10-20'), d)\n", str(out), str(victim), cwd=host.base)
    state = state_yaml(host.reports / "x.yaml", {"dir": str(out), "total": 20,
                                                 "pattern": "rows_{group}/data_{index}.ckpt"})
    for args in (("diff", "-v", str(state)), ("apply", str(state))):
        run = host.cli(*args)
        (res,) = [r for r in run.doc["resources"] if r["id"] == "extraction:eagle3"]
        assert res["status"] != "ok", res  # 10..19 are not in the tree: never counted from the link
    host.intact(before)
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == victims
    assert not (out / QUARANTINE).exists() or not any((out / QUARANTINE).rglob("data_1*.ckpt"))


def test_an_extraction_quarantine_planted_as_a_link_is_refused(host):
    out = host.base / "hs"
    write_samples(out, range(10), group=10)
    write_samples(out, range(10, 20), group=10, cut=10)  # damaged: apply would move them aside
    for p in out.rglob("*"):
        age(p)  # old: not a sample being written
    host.give(out)
    before = host.outside()
    as_user("import os, sys\nos.symlink(sys.argv[2], os.path.join(sys.argv[1], '.reconcile-quarantine'))\n",
            str(out), str(host.root_only), cwd=host.base)
    state = state_yaml(host.reports / "x.yaml", {"dir": str(out), "total": 20,
                                                 "pattern": "rows_{group}/data_{index}.ckpt",
                                                 "allow_missing": list(range(10, 20))})
    run = host.cli("apply", str(state))
    (res,) = [r for r in run.doc["resources"] if r["id"] == "extraction:eagle3"]
    refused(res, QUARANTINE)
    host.intact(before)
    assert len(list((out / "rows_10-20").iterdir())) == 10  # nothing moved
