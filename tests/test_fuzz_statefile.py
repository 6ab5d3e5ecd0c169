"""The state-file fuzzer (tests/fuzz_support.py): at least 5,000 generated inputs a run, seeded
and reproducible (RECONCILE_FUZZ_SEED, RECONCILE_FUZZ_INPUTS), each loaded in a forked child
under a time and memory bound. It fails on any traceback, hang or crash, on a problem that is
not one `file:line:col: message` line, and, where the input parsed as YAML, on a problem whose
position is not the position of a node of the document. The same inputs hold the loader equal
to ruamel's own (its pure-Python safe loader) wherever docs/state-file.md does not say they
differ, and its two parsers (libyaml's and ruamel's) equal to each other. A sample goes through
the real CLI: `validate` exits 0 or 1, `diff --format json` of a bad file prints an error report."""

from __future__ import annotations

import datetime
import json
import math
import os
import random
import re

from cli_support import run_cli
from fuzz_support import run_all, seed_texts, state_inputs
from reconcile_host.pipeline.statefile import StateFileError, load
from reconcile_host.pipeline.statefile.positions import _BREAK, Positions, _Builder, _events, _plain, parse_yaml

SEED = int(os.environ.get("RECONCILE_FUZZ_SEED", "13"))
COUNT = int(os.environ.get("RECONCILE_FUZZ_INPUTS", "5000"))
LABEL = "fuzz.yaml"
PROBLEM = re.compile(r"fuzz\.yaml:(\d+):(\d+): \S[^\n\r]*")


def _text(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text[1:] if text.startswith("\ufeff") else text


def _node_positions(pos: Positions) -> set[tuple[int, int]]:
    return set(pos.values.values()) | set(pos.keys.values())


def check_problems(data: bytes, problems: list[str]) -> str:
    if not problems:
        return "StateFileError without a problem"
    text = _text(data)
    lines = len(_BREAK.findall(text)) + 1 if text is not None else data.count(b"\n") + 1
    parsed = None
    if text is not None:
        try:
            parsed = parse_yaml(text, LABEL)
        except StateFileError:
            pass
    for p in problems:
        m = PROBLEM.fullmatch(p)
        if not m:
            return f"not one file:line:col: message line: {p!r}"
        line, col = int(m.group(1)), int(m.group(2))
        if not (1 <= line <= lines and col >= 1):
            return f"position {line}:{col} outside the input ({lines} lines): {p!r}"
        if parsed is not None and parsed[0] is not None and (line, col) not in _node_positions(parsed[1]):
            return f"position {line}:{col} is not the position of a node of the document: {p!r}"
    return ""


def _jsonlike(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _jsonlike(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_jsonlike(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str)) and not isinstance(value, datetime.date)


def differential(text: str) -> str:
    """Our loader against ruamel's safe loader, and libyaml's events against ruamel's parser's."""
    from ruamel.yaml import YAML

    ours, pos = parse_yaml(text, LABEL)
    roots = []
    for pure in (False, True):
        builder = _Builder(LABEL, _limits())
        try:
            roots.append((builder.build(_events(text, pure=pure)), builder.problems))
        except StateFileError:
            return ""  # a limit: both parsers stream the same events up to it
        except Exception as exc:
            if not type(exc).__module__.startswith("ruamel"):
                raise
            # A tab as separating white space (`key:<TAB>value`) is YAML 1.2 (s-separate-in-line)
            # that libyaml reads and ruamel's scanner refuses: documented, and the spec's side.
            roots.append("tab" if "'\\t'" in str(exc) else None)
    if roots[0] is not None and roots[1] is None:
        return "libyaml's parser accepts what ruamel's refuses"
    if roots[1] == "tab":
        return ""
    if roots[0] is not None and roots[1] is not None and roots[0][0] is not None:
        a_pos, b_pos = Positions(), Positions()
        if _plain(roots[0][0], (), a_pos) != _plain(roots[1][0], (), b_pos) or a_pos != b_pos:
            return "the two parsers' events differ"
    try:
        theirs = YAML(typ="safe", pure=True).load(text)
    except Exception:
        return ""  # ruamel refuses or fails (e.g. on '_'): our refusals are checked elsewhere
    if _jsonlike(theirs) and theirs != ours:
        return f"differs from ruamel's safe loader: ours {str(ours)[:200]}; ruamel {str(theirs)[:200]}"
    return ""


def _limits():
    from reconcile_host.pipeline.statefile.positions import LIMITS

    return LIMITS


def check_state(data: bytes) -> str:
    try:
        load(LABEL, text=data, use_cache=False)
    except StateFileError as exc:
        return check_problems(data, exc.problems)
    text = _text(data)
    return differential(text) if text is not None else "invalid UTF-8 accepted"


def test_seeds_are_the_shipped_states_and_the_docs_examples():
    seeds = seed_texts()
    assert len(seeds) >= 10
    assert any("version: 1" in s and "units:" in s for s in seeds)


def test_fuzz_state_files_in_process(tmp_path):
    inputs = list(state_inputs(SEED, COUNT))
    assert len(inputs) >= min(COUNT, 5000) and len(set(inputs)) > 0.8 * len(inputs)
    bad = run_all(inputs, check_state)
    if bad:
        (tmp_path / "failing").mkdir()
        for i in bad:
            (tmp_path / "failing" / f"{i}.yaml").write_bytes(inputs[i])
    report = "\n".join(f"input {i} (seed {SEED}): {why}" for i, why in sorted(bad.items())[:10])
    assert not bad, f"{len(bad)} of {len(inputs)} inputs failed; saved in {tmp_path / 'failing'}\n{report}"


def test_fuzz_sample_through_the_cli(tmp_path):
    rng = random.Random(SEED)
    inputs = list(state_inputs(SEED + 1, 400))
    sample = rng.sample(inputs, 30)
    bad_json = 0
    for n, data in enumerate(sample):
        path = tmp_path / f"in{n}.yaml"
        path.write_bytes(data)
        proc = run_cli(tmp_path, "validate", str(path))
        assert proc.returncode in (0, 1), (n, proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
        if proc.returncode == 1:
            for line in proc.stderr.splitlines():
                assert re.fullmatch(re.escape(str(path)) + r":\d+:\d+: \S.*", line), line
            if bad_json < 8:  # a JSON consumer gets an error report, never an empty file
                bad_json += 1
                out = run_cli(tmp_path, "diff", "--format", "json", str(path))
                doc = json.loads(out.stdout)
                assert out.returncode == 1 and doc["exit_code"] == 1 and doc["problems"], out.stderr
                assert [p["text"] for p in doc["problems"]] == proc.stderr.splitlines()
        else:
            assert proc.stderr == ""
