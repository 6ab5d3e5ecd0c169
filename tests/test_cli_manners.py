"""The command line's manners, through the real CLI: which FILE is read when none is
given (--help says what commands.resolve_state_file does, in its order), every duration option
named DURATION in --help, and click's shell completion as docs/commands.md says to install it.
Colour (NO_COLOR, TERM=dumb) is in tests/test_report_text.py and tests/test_log.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv, run_cli
from reconcile_host.commands import COMPLETE_VAR

RECONCILE = Path(sys.executable).with_name("reconcile")  # the console script pip installed


def helped(tmp_path: Path, *command: str) -> str:
    proc = run_cli(tmp_path, *command, "--help")
    assert proc.returncode == 0, proc.stderr
    return " ".join(proc.stdout.split())  # click wraps lines where it likes


def commands_listed(tmp_path: Path) -> list[str]:
    text = run_cli(tmp_path, "--help").stdout
    return re.findall(r"^  ([a-z][a-z-]*)  ", text.split("Commands:", 1)[1], re.M)


@pytest.mark.parametrize("command", ["diff", "apply", "watch", "slurm-health"])
def test_help_says_which_file_is_read_without_one(tmp_path, command):
    # What the command really tries, in its order: its own refusal in a directory with none of them.
    proc = subprocess.run(reconcile_argv(command), capture_output=True, text=True, env=cli_env(tmp_path),
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 1, proc
    tried = re.fullmatch(r"reconcile: error: no state file given and none found; tried (.*)\n", proc.stderr)
    assert tried, proc.stderr
    short = os.uname().nodename.split(".", 1)[0]
    words = [w.replace(" (unset)", "") for w in tried.group(1).split(", ")]
    assert words == ["$RECONCILE_STATE", f"states/{short}.yaml", "state.yaml"], words
    said = helped(tmp_path, command)
    expected = [words[0], "states/<short hostname>.yaml", "./state.yaml"]
    where = [said.find(w) for w in expected]
    assert -1 not in where and where == sorted(where), (expected, said)


def test_the_first_file_that_exists_is_read(tmp_path):
    short = os.uname().nodename.split(".", 1)[0]
    (tmp_path / "state.yaml").write_text("version: 1\n")
    (tmp_path / "states").mkdir()
    (tmp_path / "states" / f"{short}.yaml").write_text("version: 1\n")
    for env, used in (({}, f"states/{short}.yaml"),
                      ({"RECONCILE_STATE": str(tmp_path / "state.yaml")}, str(tmp_path / "state.yaml"))):
        proc = subprocess.run(reconcile_argv("diff", "--format", "json"), capture_output=True, text=True,
                              env=cli_env(tmp_path, **env), cwd=tmp_path, timeout=60)
        assert proc.returncode == 0 and json.loads(proc.stdout)["state_file"] == used, (env, proc)
    (tmp_path / "states" / f"{short}.yaml").unlink()
    proc = subprocess.run(reconcile_argv("diff", "--format", "json"), capture_output=True, text=True,
                          env=cli_env(tmp_path), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["state_file"] == "state.yaml", proc


def test_every_duration_option_is_named_duration_and_no_value_is_bare_text(tmp_path):
    from reconcile_host.cli import main
    from reconcile_host.core.values import parse_duration

    def is_duration(default) -> bool:
        try:
            parse_duration(default)
            return isinstance(default, str)
        except (TypeError, ValueError):
            return False

    names = commands_listed(tmp_path)
    assert {"diff", "apply", "watch", "slurm-health", "log"} <= set(names), names
    durations = []
    for name in names:
        said = helped(tmp_path, name)
        assert " TEXT " not in said, (name, said)
        for param in main.commands[name].params:
            long = max(getattr(param, "opts", []), key=len, default="")
            if re.search(r"(timeout|interval|deadline)$", long) or is_duration(param.default):
                durations.append((name, long))
                assert f"{long} DURATION " in said, (name, long, said)
    assert ("apply", "--lock-timeout") in durations and ("watch", "--interval") in durations
    assert ("slurm-health", "--deadline") in durations and ("watch", "--lock-timeout") in durations


def completion_script(shell: str, tmp_path: Path) -> str:
    proc = subprocess.run([str(RECONCILE)], capture_output=True, text=True, timeout=60,
                          env=cli_env(tmp_path, **{COMPLETE_VAR: f"{shell}_source"}))
    assert proc.returncode == 0 and proc.stdout, proc
    return proc.stdout


def test_bash_completion_completes_commands_options_formats_and_files(tmp_path):
    if not RECONCILE.exists():
        pytest.skip(f"no console script at {RECONCILE}")
    script = tmp_path / "reconcile.bash"
    script.write_text(completion_script("bash", tmp_path))
    (tmp_path / "state.yaml").write_text("version: 1\n")

    def complete(*words: str) -> list[str]:
        # What bash does on TAB once the script is sourced (docs/commands.md): the function
        # `complete -p reconcile` names, called with COMP_WORDS/COMP_CWORD set.
        line = " ".join(f"'{w}'" for w in words)
        bash = (f'source {script}; func=$(complete -p reconcile | sed -E "s/.* -F ([^ ]+) .*/\\1/"); '
                f'COMP_WORDS=(reconcile {line}); COMP_CWORD={len(words)}; $func reconcile; '
                'printf "%s\\n" "${COMPREPLY[@]}"')
        env = cli_env(tmp_path, PATH=f"{RECONCILE.parent}:{os.environ['PATH']}")
        proc = subprocess.run(["bash", "-c", bash], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=60)
        assert proc.returncode == 0, proc
        return [w for w in proc.stdout.splitlines() if w]

    assert set(complete("")) >= set(commands_listed(tmp_path))
    assert complete("sl") == ["slurm-health"]
    assert "--lock-timeout" in complete("apply", "--lo")
    formats = re.search(r"--format \[([a-z|]+)\]", helped(tmp_path, "diff")).group(1).split("|")
    assert complete("diff", "--format", "") == formats
    # FILE is a path: click answers "file" (its protocol), and the script then hands the word to
    # bash's own file completion (compopt -o default).
    probe = subprocess.run([str(RECONCILE)], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                           env=cli_env(tmp_path, COMP_WORDS="reconcile diff st", COMP_CWORD="2",
                                       **{COMPLETE_VAR: "bash_complete"}))
    assert probe.stdout.splitlines() == ["file,st"], probe
    assert "compopt -o default" in script.read_text()


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completion_scripts_are_produced(tmp_path, shell):
    if not RECONCILE.exists():
        pytest.skip(f"no console script at {RECONCILE}")
    text = completion_script(shell, tmp_path)
    assert f"{COMPLETE_VAR}={shell}_complete" in text and "reconcile" in text, text
    if shutil.which(shell) is None:
        return  # not installed here (nor by .ci/run): the script is produced, not parsed
    path = tmp_path / f"reconcile.{shell}"
    path.write_text(text)
    proc = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc


def test_docs_list_the_formats_help_lists(tmp_path):
    # README's and docs/commands.md's `--format a|b|…` against each command's own --help.
    def choices(command: str) -> list[str]:
        return re.search(r"--format \[([a-z|]+)\]", helped(tmp_path, command)).group(1).split("|")

    assert choices("diff") == choices("apply")
    root = Path(__file__).resolve().parent.parent
    for doc in ("README.md", "docs/commands.md"):
        text = (root / doc).read_text().replace("\\|", "|")
        found = list(re.finditer(r"--format (text(?:\|[a-z]+)+)", text))
        assert found, doc
        for m in found:
            paragraph = text[text.rfind("\n\n", 0, m.start()):m.start()]
            command = "log" if "reconcile log" in paragraph else "diff"
            assert m.group(1).split("|") == choices(command), (doc, paragraph, m.group(1))
