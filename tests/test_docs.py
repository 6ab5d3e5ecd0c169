"""Every shell and YAML block of README.md, CONTRIBUTING.md and docs/*.md works as pasted, or is
marked a fragment (`<!-- fragment -->` on the line directly above its opening fence).

- A shell block (```sh/console, or an untagged block opening with a `$ ` prompt) is run command by
  command with bash, in a temporary copy of the repository (its .venv linked in, `.venv/bin` first
  on PATH, HOME and the XDG directories in the temporary directory). Each command must exit 0, or
  the status its trailing `# exit N` comment names. In a `$ ` session, what the doc shows after a
  command must be what it prints (`...` stands for any lines, digits for any digits).
  A `python -m pytest` command is run with `--collect-only` (the suite cannot run itself): it
  must select at least one test (pytest exits 5 when `-k` selects none).
- A YAML block that is a state file (or a section of one: `version: 1` is put above it) must pass
  `reconcile validate`; an inventory (`version` and `hosts`) must load. Other YAML (CI jobs,
  playbooks, configuration of other tools) is a fragment.

The authority is the command itself (bash, reconcile validate, pytest's collection), run on the
doc's own text as extracted from the file at test time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from docs_support import ROOT, Block, all_blocks, commands, output_matches, strip_comment

BLOCKS = all_blocks()
CHECKED = [b for b in BLOCKS if (b.is_shell or b.is_yaml) and not b.fragment]


def state_keys() -> set[str]:
    from reconcile_host.reconcilers import KINDS

    return {"version", "host", *KINDS}


def repo_copy(dest: Path, venv: bool) -> Path:
    """The repository's files as a clone has them (tracked and untracked, not ignored); its
    virtual environments linked in unless the block makes its own."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    for name in (".venv", ".venv-torch") if venv else ():
        if (ROOT / name).exists():
            (dest / name).symlink_to((ROOT / name).resolve())
    return dest


def user_env(home: Path, cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECONCILE_", "PYTEST_"))}
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / ".local/state"), XDG_CACHE_HOME=str(home / ".cache"),
               PATH=f"{cwd / '.venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", NO_COLOR="1")
    return env


def test_blocks_are_found_and_the_marker_is_only_above_fences():
    """The extraction itself: blocks exist in every checked file, and a fragment marker that is
    not directly above a fence (a blank line between, say) marks nothing: it is an error."""
    assert len({b.file for b in BLOCKS}) >= 10 and CHECKED
    for path in {ROOT / b.file for b in BLOCKS}:
        lines = path.read_text().split("\n")
        for n, line in enumerate(lines[:-1], 1):
            if line.strip() == "<!-- fragment -->":
                assert re.match(r"\s*(```|~~~)", lines[n]), f"{path.name}:{n}: a fragment marker not above a fence"


# As root, a block runs in namespaces of its own: every mount read-only but the user's directory
# (a block that needs root fails here instead of changing this machine: it must be a fragment),
# no network but loopback, and a PID namespace (whatever it starts dies with it).
SANDBOX = r"""
for t in $(findmnt -rn -o TARGET); do mount -o remount,bind,ro "$t" 2>/dev/null; done
mount --bind "$1" "$1" && mount -o remount,bind,rw "$1" && ip link set lo up 2>/dev/null
cd "$2" || exit 125  # the working directory again, now on the writable mount
shift 2
exec "$@"
"""


@pytest.fixture
def user_dir():
    path = Path(tempfile.mkdtemp(prefix="reconcile-docs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(argv: list[str], writable: Path, cwd: Path) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["unshare", "--mount", "--propagation", "private", "--net", "--pid", "--fork", "--kill-child",
            "--mount-proc", "bash", "-c", SANDBOX, "sandbox", str(writable), str(cwd), *argv]


def run_pasted(text: str, here: Path, user_dir: Path, timeout: float) -> subprocess.CompletedProcess:
    home = user_dir / "home"
    (user_dir / "tmp").mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    env = {**user_env(home, here), "TMPDIR": str(user_dir / "tmp")}
    return subprocess.run(as_user(["bash", "-c", text], user_dir, here), cwd=here, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("block", [b for b in CHECKED if b.is_shell], ids=lambda b: b.where)
def test_shell_block_runs_as_pasted(block: Block, user_dir):
    cmds = commands(block)
    assert cmds, f"{block.where}: no command in the block"
    here = repo_copy(user_dir / "reconcile", venv=True)
    for cmd in cmds:
        text = cmd.text
        if re.search(r"(^|\s)-m pytest(\s|$)", text):
            text += " --collect-only -q -p no:cacheprovider"
        proc = run_pasted(text, here, user_dir, timeout=120)
        assert proc.returncode == cmd.exit, (
            f"{block.where}: `{cmd.text}` exited {proc.returncode}, the doc says {cmd.exit}\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        if cmd.output:
            assert output_matches(cmd.output, proc.stdout), (
                f"{block.where}: `{cmd.text}` printed\n{proc.stdout}\nthe doc shows\n" + "\n".join(cmd.output))


@pytest.mark.parametrize("block", [b for b in CHECKED if b.is_yaml], ids=lambda b: b.where)
def test_yaml_block_is_a_valid_state_file_or_inventory(block: Block, tmp_path):
    from ruamel.yaml import YAML

    doc = YAML().load(block.text)  # round-trip: YAML 1.2, as reconcile reads state files
    assert isinstance(doc, dict), f"{block.where}: not a mapping; a fragment? mark it <!-- fragment -->"
    path = tmp_path / "pasted.yaml"
    if "hosts" in doc and "version" in doc:
        from reconcile_host.doors.inventory import load_inventory
        from reconcile_host.pipeline.statefile import StateFileError

        path.write_text(block.text)
        try:
            load_inventory(str(path))
        except StateFileError as exc:
            raise AssertionError(f"{block.where}: the inventory does not load: {exc}") from None
        return
    unknown = set(doc) - state_keys()
    assert not unknown, (f"{block.where}: neither a state file nor an inventory (keys {sorted(unknown)}): "
                         "make it one, or mark it <!-- fragment -->")
    path.write_text(block.text if "version" in doc else "version: 1\n" + block.text)
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "reconcile"), "validate", str(path)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120,
                          # (as root the defaults are the machine's /var/cache and /var/lib/reconcile)
                          env={**user_env(tmp_path, ROOT), "RECONCILE_CACHE_DIR": str(tmp_path / "cache"),
                               "RECONCILE_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, f"{block.where}: reconcile validate says\n{proc.stderr}\n---\n{path.read_text()}"
    assert "warning:" not in proc.stderr, f"{block.where}: write the current spellings\n{proc.stderr}"


def test_readme_journal_jq_prints_one_line_per_action(nsystemd, tmp_path):
    """The README's jq example, run on the journal a real `reconcile apply` wrote: one line per action
    carried out (the journal's `result` lines), each with the four fields the README shows, no null."""
    from cli_support import NsCli, service

    block = next(b for b in BLOCKS if b.file == "README.md" and any(line.startswith("$ jq") for line in b.lines))
    jq = next(c for c in commands(block) if c.text.startswith("jq "))
    nsystemd.write_unit("doc-j.service", service("doc-j.service"))
    nsystemd.systemctl("enable", "--now", "doc-j.service", check=True)
    cli = NsCli(nsystemd, tmp_path)
    state = cli.state("version: 1\nunits:\n  doc-j.service:\n    active: false\n    enabled: false\n")
    applied = cli("apply", str(state))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "/var/lib/reconcile/journal.jsonl" in jq.text  # the path the README names (root's default)
    argv = jq.text.replace("/var/lib/reconcile/journal.jsonl", str(cli.journal))
    proc = subprocess.run(["bash", "-c", argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    printed = [json.loads(line) for line in proc.stdout.splitlines()]
    results = [e for e in cli.journal_lines() if e["event"] == "result"]
    assert len(results) == 2 and len(printed) == len(results)
    shown = [json.loads(line) for c in commands(block) for line in c.output if line.startswith("[")]
    assert shown and all(len(p) == len(shown[0]) and None not in p for p in printed), (printed, shown)
    assert [p[1:] for p in printed] == [[e["resource"], e["action"], e["result"]] for e in results]


def test_readme_first_command_checks_this_machine(user_dir):
    """The README's first command makes a virtual environment (a fragment here: pip would need the
    network), then checks this machine against states/example.yaml, "exit 0: no drift": that
    last step, as pasted, with the test's own installation."""
    block = next(b for b in BLOCKS if b.file == "README.md" and b.is_shell)
    last = commands(block)[0].text.split("&&")[-1].strip()
    assert last == ".venv/bin/reconcile diff states/example.yaml", last
    readme = (ROOT / "README.md").read_text()
    assert "(exit 0: no drift)" in readme
    proc = run_pasted(last, repo_copy(user_dir / "reconcile", venv=True), user_dir, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def ci_packages() -> tuple[set[str], set[str]]:
    """What .ci/run installs: the Debian packages of its `pkg:path` list (and python3-venv), and
    the pip packages of torch's environment (every `.venv-torch/bin/pip install` of it)."""
    script = (ROOT / ".ci" / "run").read_text()
    loop = script[script.index("for pkg_cmd in"):script.index("; do", script.index("for pkg_cmd in"))]
    apt = {word.split(":")[0] for word in loop.split()[3:] if ":" in word}
    apt |= set(re.findall(r"need\+=\(([\w.+-]+)\)", script))
    pip = {word for line in re.findall(r"\.venv-torch/bin/pip install ([^\n]+)", script)
           for word in line.split() if not word.startswith("-")}
    return apt, pip


def installed_by(block: Block) -> tuple[set[str], set[str]]:
    """The Debian and pip packages a doc's install block names (options and comments left out)."""
    apt: set[str] = set()
    pip: set[str] = set()
    for cmd in commands(block):
        for part in strip_comment(cmd.text).split("&&"):
            words = part.split()
            for tool, into in (("apt-get", apt), ("pip", pip)):
                at = next((i for i, w in enumerate(words) if w.endswith(tool)), None)
                if at is not None and words[at + 1:at + 2] == ["install"]:
                    into.update(w for w in words[at + 2:] if not w.startswith("-"))
    return apt, pip


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md"])
def test_docs_name_exactly_the_packages_ci_installs(doc):
    # One list: the README's block, CONTRIBUTING's and .ci/run's, equal both ways.
    apt, pip = ci_packages()
    assert {"gcc", "g++", "systemd", "python3-torch", "python3-venv", "podman"} <= apt
    assert {"safetensors", "transformers", "accelerate", "lightning", "deepspeed"} <= pip
    found = [b for b in BLOCKS if b.file == doc and installed_by(b)[0]]
    assert len(found) == 1, f"{doc}: {len(found)} blocks install Debian packages; one list, please"
    for named, ci in zip(installed_by(found[0]), (apt, pip), strict=True):
        assert named == ci, f"{doc}:{found[0].line}: missing {sorted(ci - named)}, extra {sorted(named - ci)}"


def test_the_journal_lines_shown_have_a_real_journals_keys(nsystemd, tmp_path):
    """docs/commands.md's "Journal and lock" block: each line shown has the keys, in order, of the
    line of the same event a real `reconcile apply` wrote (a unit stopped in the namespaced systemd)."""
    from cli_support import NsCli, service

    text = (ROOT / "docs" / "commands.md").read_text()
    section = text[text.index("## Journal and lock"):]
    block = next(b for b in BLOCKS if b.file == "docs/commands.md" and b.lang == "json"
                 and "\n".join(b.lines) in section)
    shown = {e["event"]: list(e) for e in map(json.loads, block.lines)}
    nsystemd.write_unit("doc-k.service", service("doc-k.service"))
    nsystemd.systemctl("enable", "--now", "doc-k.service", check=True)
    cli = NsCli(nsystemd, tmp_path)
    applied = cli("apply", str(cli.state("version: 1\nunits:\n  doc-k.service:\n    active: false\n")))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    real: dict[str, list[str]] = {}
    for e in cli.journal_lines():
        real.setdefault(e["event"], list(e))
    assert set(shown) == {"intent", "result", "verified"} <= set(real), (shown, real)
    assert "boot" in real["intent"]  # this machine's boot id is readable: the line carries it
    assert shown == {event: real[event] for event in shown}, (shown, real)
