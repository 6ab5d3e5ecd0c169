"""Adding a sink is one module in doors/sinks/ and one line of its registry (docs/design.md,
"Sinks"), nothing else.

In a temporary copy of the package, the `record` sink docs/design.md sketches (the module and
the registration line taken from the doc's own blocks) is added from exactly those two places;
then the real CLI of that copy runs `diff`, `apply`, a refused `apply` (the lock held), a bad
state file, and a `watch` pass with `--record FILE`, and the file says what each run ended with:
the sink saw every finished run, refusals included, with their closed-set reasons."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from addition_support import copy_package, documented_sketch, env_for, insert_at

OK_STATE = "version: 1\nmounts:\n  /:\n    mounted: true\n"


# The sink's module and its SINKS line, as docs/design.md ("Sinks") shows them.
SINK_MODULE, REGISTRY_LINE = documented_sketch("class Record:", "SINKS: dict[str, str]", '"record":')


def copy_with_a_new_sink(tmp: Path) -> Path:
    pkg = copy_package(tmp)
    (pkg / "doors" / "sinks" / "record.py").write_text(SINK_MODULE)
    insert_at(pkg / "doors" / "sinks" / "__init__.py", 'SINKS: dict[str, str] = {\n', REGISTRY_LINE, after=True)
    return pkg


def run(pkg: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reconcile_host", *args], capture_output=True, text=True,
                          env=env_for(pkg, tmp), timeout=120, cwd=tmp)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_sink_added_in_two_places_sees_every_finished_run(tmp_path):
    pkg = copy_with_a_new_sink(tmp_path)
    which = subprocess.run([sys.executable, "-c", "import reconcile_host; print(reconcile_host.__file__)"],
                           capture_output=True, text=True, env=env_for(pkg, tmp_path), check=True)
    assert which.stdout.strip() == str(pkg / "__init__.py")  # the copy runs, not the installed package
    state, bad, out = tmp_path / "s.yaml", tmp_path / "bad.yaml", tmp_path / "runs.jsonl"
    state.write_text(OK_STATE)
    bad.write_text("version: 1\nmounts: [\n")
    journal = tmp_path / "j" / "journal.jsonl"

    for command in ("diff", "apply", "watch"):  # the option the sink declared is on each command it named
        assert "--record FILE" in run(pkg, tmp_path, command, "--help").stdout
    assert "--record" not in run(pkg, tmp_path, "log", "--help").stdout

    assert run(pkg, tmp_path, "diff", str(state), "--record", str(out)).returncode == 0
    applied = run(pkg, tmp_path, "apply", str(state), "--journal", str(journal), "--record", str(out))
    assert applied.returncode == 0, applied.stderr
    from reconcile_host.pipeline.journal import Journal  # a real flock on the lock file the copy uses

    with Journal.at(str(journal)).lock() as held:
        held.acquire()
        refused = run(pkg, tmp_path, "apply", str(state), "--journal", str(journal), "--record", str(out))
    assert refused.returncode == 1 and "another reconcile apply holds" in refused.stderr
    invalid = run(pkg, tmp_path, "diff", str(bad), "--record", str(out))
    assert invalid.returncode == 1 and invalid.stderr.startswith(f"{bad}:")
    assert records(out) == [
        {"command": "diff", "exit_code": 0, "outcome": "", "reason": None},
        {"command": "apply", "exit_code": 0, "outcome": "", "reason": None},
        {"command": "apply", "exit_code": 1, "outcome": "", "reason": "lock-held"},
        {"command": "diff", "exit_code": 1, "outcome": "", "reason": "state-file"},
    ]

    # The watch's passes: each one's outcome, as the pass hook hands it to every sink.
    watch_out = tmp_path / "passes.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "reconcile_host", "watch", str(state), "--interval", "1h",
                             "--journal", str(journal), "--record", str(watch_out)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env_for(pkg, tmp_path))
    try:
        deadline = time.monotonic() + 120
        while not records(watch_out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert records(watch_out) == [{"command": "apply", "exit_code": 0, "outcome": "ok", "reason": None}]
