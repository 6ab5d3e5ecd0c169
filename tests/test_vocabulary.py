"""One vocabulary: a state file written with the old spellings (`resume:` for an
extraction's job or a checkpoint's `resume_from`, `verify: recent|all|resume`) keeps working,
with one `FILE:LINE:COL: warning:` line per old spelling on stderr naming the new one.

The authority is the real CLI: the old-spelled file's report equals the new-spelled file's,
both asked of `reconcile` on the same files; the positions are found in the file's own text; the
editor schema is checked with jsonschema on the file the repository ships. The vocabulary's
table (docs/state-file.md) is held against the kinds' schema fragments.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import cli_env, reconcile_argv
from extraction_support import write_sample, write_samples
from fake_extract import safetensors_bytes

ROOT = Path(__file__).resolve().parent.parent
KINDS_DIR = ROOT / "schema" / "kinds"

OLD = """\
version: 1
extractions:
  a:
    dir: {root}/a
    total: 10
    verify: recent
    resume:
      command: ["true"]
  b:
    dir: {root}/b
    total: 5
    verify: all
checkpoints:
  run:
    dir: {root}/run
    layout: hf-trainer
    model_only: true
    resume: whole
    verify: resume
"""
# The same file in the new spellings, written by hand (not derived from the old one).
NEW = """\
version: 1
extractions:
  a:
    dir: {root}/a
    total: 10
    verify: at-risk
    job:
      command: ["true"]
  b:
    dir: {root}/b
    total: 5
    verify: content
checkpoints:
  run:
    dir: {root}/run
    layout: hf-trainer
    model_only: true
    resume_from: whole
    verify: at-risk
"""
# (the line, a key or a value, its new spelling): where each warning must point, and what it names.
OLD_SPELLINGS = [("    verify: recent", "value", "at-risk"), ("    resume:", "key", "job"),
                 ("    verify: all", "value", "content"), ("    resume: whole", "key", "resume_from"),
                 ("    verify: resume", "value", "at-risk")]


def make_tree(root: Path) -> Path:
    """Two extractions (one with a sample cut off mid-write) and a Trainer run directory whose
    newest step is torn: every field the old spellings name has something to say."""
    write_samples(root / "a", range(8))
    write_sample(root / "a", 8, cut=100)
    write_samples(root / "b", range(5))
    for n in (2, 4):
        step = root / "run" / f"checkpoint-{n}"
        step.mkdir(parents=True)
        data = safetensors_bytes(n, 4096)
        (step / "model.safetensors").write_bytes(data if n == 2 else data[:500])
        (step / "trainer_state.json").write_text(json.dumps({"global_step": n}))
    for path in sorted(root.rglob("*"), reverse=True):  # one fixed time: two trees observe alike
        os.utime(path, (1e9, 1e9))
    return root


def where(text: str, line_text: str, part: str = "key") -> tuple[int, int]:
    """1-based line and column of the key (or the value) of the one line that is `line_text`."""
    lines = text.splitlines()
    (n,) = [i for i, line in enumerate(lines) if line == line_text]
    indent = len(line_text) - len(line_text.lstrip())
    return n + 1, (line_text.index(": ") + 3 if part == "value" else indent + 1)


def assert_warned(stderr: str, label: str, text: str) -> None:
    """One line per old spelling, at its position in the text, naming the new spelling; nothing else."""
    want = sorted((*where(text, line_text, part), new) for line_text, part, new in OLD_SPELLINGS)
    lines = [line for line in stderr.splitlines() if line]
    assert len(lines) == len(want), stderr
    for got, (line, col, new) in zip(lines, want, strict=True):
        assert got.startswith(f"{label}:{line}:{col}: warning: ") and f"write {new!r}" in got, (got, line, col)


def run(tmp: Path, *args: str, state_dir: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = cli_env(tmp, RECONCILE_STATE_DIR=str(state_dir))
    return subprocess.run(reconcile_argv(*args), capture_output=True, text=True, timeout=120, cwd=tmp, env=env,
                          input=stdin)


def comparable(report: dict, root: Path) -> dict:
    """A report less what differs between two runs by nature (when, how long, the file's name)."""
    doc = {k: v for k, v in report.items() if k not in ("started", "duration_s", "state_file")}
    return json.loads(json.dumps(doc).replace(str(root), "ROOT"))


def test_old_spellings_give_the_new_spellings_report_and_one_warning_each(tmp_path):
    root = make_tree(tmp_path / "t")
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(OLD.format(root=root))
    new.write_text(NEW.format(root=root))

    proc_new = run(tmp_path, "diff", "--format", "json", str(new), state_dir=tmp_path / "state-new")
    assert proc_new.returncode == 2 and proc_new.stderr == ""
    proc_old = run(tmp_path, "diff", "--format", "json", str(old), state_dir=tmp_path / "state-old")
    assert proc_old.returncode == proc_new.returncode
    # stdout is the report alone (the warnings are on stderr), equal to the new spelling's
    assert comparable(json.loads(proc_old.stdout), root) == comparable(json.loads(proc_new.stdout), root)
    assert_warned(proc_old.stderr, str(old), old.read_text())
    assert {d["field"] for r in json.loads(proc_old.stdout)["resources"] for d in r["drift"]} >= {"resume_from"}

    # Again: the validation cache holds the file now (its entry is not rewritten), and still it warns.
    (entry,) = [e for e in (tmp_path / "cache" / "validated").iterdir() if json.loads(e.read_text())["warnings"]]
    written = entry.stat().st_mtime_ns
    again = run(tmp_path, "diff", "--format", "json", str(old), state_dir=tmp_path / "state-old")
    assert entry.stat().st_mtime_ns == written, "the cache was not used"
    assert again.returncode == 2 and json.loads(again.stdout)["exit_code"] == 2
    assert_warned(again.stderr, str(old), old.read_text())

    # The text report too; and a state on stdin, named by --state-label.
    text = run(tmp_path, "diff", str(old), state_dir=tmp_path / "state-old")
    assert text.returncode == 2
    assert_warned(text.stderr, str(old), old.read_text())
    piped = run(tmp_path, "diff", "--format", "json", "--state-label", "mine.yaml", "-",
                state_dir=tmp_path / "state-old", stdin=old.read_text())
    assert piped.returncode == 2 and json.loads(piped.stdout)["exit_code"] == 2
    assert_warned(piped.stderr, "mine.yaml", old.read_text())


def test_apply_with_old_spellings_does_what_the_new_spellings_do(tmp_path):
    reports, texts = {}, {}
    for spelling, template in (("old", OLD), ("new", NEW)):
        root = make_tree(tmp_path / spelling)
        state = tmp_path / f"{spelling}.yaml"
        texts[spelling] = template.format(root=root)
        state.write_text(texts[spelling])
        proc = run(tmp_path, "apply", "--format", "json", "--journal", str(tmp_path / f"{spelling}.jsonl"),
                   str(state), state_dir=tmp_path / f"state-{spelling}")
        reports[spelling] = (proc.returncode, json.loads(proc.stdout), proc.stderr)
        # What apply did, on the files themselves: the torn step and the cut-off sample moved aside.
        assert not (root / "run" / "checkpoint-4").exists() and (root / "run" / "checkpoint-2").exists()
        assert not (root / "a" / "rows_0-10" / "data_8.ckpt").exists()
    (rc_old, old, err_old), (rc_new, new, err_new) = reports["old"], reports["new"]
    assert rc_old == rc_new and err_new == ""
    assert_warned(err_old, str(tmp_path / "old.yaml"), texts["old"])

    def outcome(report: dict) -> list:
        return [(r["id"], r["status"], r["drift"], [(a["action"], a["result"]) for a in r["actions"]])
                for r in report["resources"]]

    assert outcome(old) == outcome(new)


def test_validate_says_it_and_the_file_stays_valid(tmp_path):
    root = make_tree(tmp_path / "t")
    old = tmp_path / "old.yaml"
    old.write_text(OLD.format(root=root))
    proc = run(tmp_path, "validate", str(old), state_dir=tmp_path / "state")
    assert proc.returncode == 0 and proc.stdout == "1 state file valid\n"
    assert_warned(proc.stderr, str(old), old.read_text())
    again = run(tmp_path, "validate", str(old), state_dir=tmp_path / "state")  # from the cache
    assert again.returncode == 0
    assert_warned(again.stderr, str(old), old.read_text())
    piped = run(tmp_path, "validate", "-", state_dir=tmp_path / "state", stdin=old.read_text())
    assert piped.returncode == 0
    assert_warned(piped.stderr, "<stdin>", old.read_text())


BOTH = [
    ("extractions", "a", "    resume:\n      command: [\"true\"]\n    job:\n      command: [\"true\"]\n",
     "resume", "job"),
    ("checkpoints", "run", "    resume_from: whole\n    resume: any\n", "resume", "resume_from"),
]


@pytest.mark.parametrize("key,name,fields,old,new", BOTH, ids=[b[0] for b in BOTH])
def test_both_spellings_of_one_field_is_an_error_at_the_old_key(tmp_path, key, name, fields, old, new):
    text = f"version: 1\n{key}:\n  {name}:\n    dir: /data/{name}\n"
    text += ("    total: 3\n" if key == "extractions" else "") + fields
    state = tmp_path / "both.yaml"
    state.write_text(text)
    line, col = where(text, next(x for x in text.splitlines() if x.startswith(f"    {old}:")))
    other, _ = where(text, next(x for x in text.splitlines() if x.startswith(f"    {new}:")))
    for args in (("validate",), ("diff", "--format", "json"), ("apply", "--format", "json")):
        proc = run(tmp_path, *args, str(state), state_dir=tmp_path / "state")
        assert proc.returncode == 1, (args, proc.stderr)
        (problem,) = proc.stderr.splitlines()  # the one problem, no "unknown key" beside it, no warning
        assert problem == (f"{state}:{line}:{col}: {key}.{name}.{old}: {old!r} is the old spelling of {new!r}, "
                           f"which is given too (line {other}): keep {new!r} only"), args
        if "json" in args:
            (reported,) = json.loads(proc.stdout)["problems"]  # the error report on stdout: the same line
            assert (reported["line"], reported["column"], reported["text"]) == (line, col, problem)


def test_a_problem_elsewhere_is_reported_with_the_warnings_in_file_order(tmp_path):
    text = OLD.format(root=tmp_path).replace("    total: 5\n", "    total: 5\n    min_done: 9\n")
    state = tmp_path / "s.yaml"
    state.write_text(text)
    proc = run(tmp_path, "validate", str(state), state_dir=tmp_path / "state")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    line, col = where(text, "    min_done: 9", "value")
    assert f"{state}:{line}:{col}: extractions.b.min_done: 9 can never be done: there are only 5 samples (total)" \
        in lines
    warnings = [x for x in lines if ": warning: " in x]
    assert len(warnings) == len(OLD_SPELLINGS)
    positions = [tuple(map(int, x[len(str(state)) + 1:].split(":")[:2])) for x in lines]
    assert positions == sorted(positions)


def test_one_warning_for_an_old_spelling_merged_into_several_resources(tmp_path):
    """An anchor merged into two extractions holds the old spelling once: one line, at the anchor."""
    text = ("version: 1\nextractions:\n  a: &common\n    dir: /data/a\n    total: 3\n    verify: recent\n"
            "  b:\n    <<: *common\n    dir: /data/b\n")
    state = tmp_path / "s.yaml"
    state.write_text(text)
    proc = run(tmp_path, "validate", str(state), state_dir=tmp_path / "state")
    assert proc.returncode == 0
    line, col = where(text, "    verify: recent", "value")
    (warning,) = proc.stderr.splitlines()
    assert warning.startswith(f"{state}:{line}:{col}: warning: extractions.a.verify: 'recent'")


def test_a_cache_entry_without_warnings_is_validated_again(tmp_path, monkeypatch):
    """An entry an older reconcile wrote (no list of warnings) is as good as none: the file is
    validated again, warns, and the entry is rewritten with its warnings."""
    from reconcile_host.pipeline.statefile import load

    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    state = tmp_path / "old.yaml"
    state.write_text(OLD.format(root=tmp_path))
    first = load(state)
    assert len(first.warnings) == len(OLD_SPELLINGS)
    (entry,) = (tmp_path / "cache" / "validated").iterdir()
    cached = json.loads(entry.read_text())
    assert len(cached["warnings"]) == len(OLD_SPELLINGS)
    del cached["warnings"]
    entry.write_text(json.dumps(cached))
    assert load(state).warnings == first.warnings
    assert len(json.loads(entry.read_text())["warnings"]) == len(OLD_SPELLINGS)


# --- the editor schema ------------------------------------------------------------------------

def fragments() -> dict[str, dict]:
    return {p.name.split(".")[0]: json.loads(p.read_text()) for p in sorted(KINDS_DIR.glob("*.schema.json"))}


def fields_of(fragment: dict) -> dict:
    return (fragment.get("additionalProperties") or fragment)["properties"]


def test_the_editor_schema_accepts_the_old_spellings_marked_deprecated(tmp_path):
    import jsonschema
    from ruamel.yaml import YAML

    shipped = json.loads((ROOT / "schema" / "reconcile-state.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(shipped)
    old_doc = YAML(typ="safe").load(OLD.format(root="/data"))
    assert list(validator.iter_errors(old_doc)) == []
    assert list(validator.iter_errors(YAML(typ="safe").load(NEW.format(root="/data")))) == []
    bad = json.loads(json.dumps(old_doc))
    bad["extractions"]["a"]["verify"] = "recently"
    assert list(validator.iter_errors(bad)), "a value that is neither spelling must be refused"
    both = json.loads(json.dumps(old_doc))
    both["extractions"]["a"]["job"] = {"unit": "x.service"}
    assert list(validator.iter_errors(both)), "both spellings of one field must be refused, as the loader does"

    # Each old spelling the fragments list is marked deprecated in the shipped schema, naming the new one.
    listed = 0
    for key, fragment in fragments().items():
        props = fields_of(shipped["$defs"][key])
        for entry in fragment.get("x-old-spellings", []):
            listed += 1
            if "value" in entry:
                (alt,) = [a for a in props[entry["key"]]["anyOf"] if a.get("const") == entry["value"]]
                assert alt["deprecated"] is True and repr(entry["now"]) in alt["deprecationMessage"]
            else:
                prop = props[entry["key"]]
                assert prop["deprecated"] is True and repr(entry["now"]) in prop["deprecationMessage"]
    assert listed == len(OLD_SPELLINGS)


def test_the_shipped_schema_is_what_reconcile_schema_prints(tmp_path):
    proc = run(tmp_path, "schema", state_dir=tmp_path / "state")
    assert proc.returncode == 0
    shipped = json.loads((ROOT / "schema" / "reconcile-state.schema.json").read_text())
    assert json.loads(proc.stdout) == shipped, "regenerate: reconcile schema > schema/reconcile-state.schema.json"


# --- the vocabulary ---------------------------------------------------------------------------

def vocabulary() -> dict[str, str]:
    """docs/state-file.md's "Vocabulary" table: field name -> its one meaning."""
    text = (ROOT / "docs" / "state-file.md").read_text()
    section = re.split(r"\n##+ ", text.split("\n## Vocabulary\n", 1)[1], maxsplit=1)[0]  # to the next heading
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `([^`]+)`", row).group(1): row for row in rows}


def property_names(node, out: set[str]) -> set[str]:
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            out.add(name)
            property_names(sub, out)
        for key, sub in node.items():
            if key != "properties":
                property_names(sub, out)
    elif isinstance(node, list):
        for sub in node:
            property_names(sub, out)
    return out


def test_every_field_name_two_kinds_share_is_in_the_vocabulary():
    by_kind = {key: property_names(fragment, set()) for key, fragment in fragments().items()}
    shared = {name for name in set().union(*by_kind.values())
              if sum(name in names for names in by_kind.values()) > 1}
    assert {"needs", "dir", "verify", "observe_timeout"} <= shared  # the walk finds what is there
    missing = shared - set(vocabulary())
    assert not missing, f"docs/state-file.md's Vocabulary lacks {sorted(missing)}"


def test_the_integrity_depth_has_one_set_of_words():
    row = vocabulary()["verify"]
    words = set(re.findall(r"`([a-z-]+)`", row.split("|")[2]))
    kinds = {key: fields_of(f)["verify"]["enum"] for key, f in fragments().items() if "verify" in fields_of(f)}
    assert set(kinds) == {"extractions", "checkpoints"}
    for key, enum in kinds.items():
        assert set(enum) <= words, f"{key}'s verify {enum} uses words the vocabulary does not define"
    assert set().union(*map(set, kinds.values())) == words, "a word of the vocabulary no kind uses"


def test_each_old_spelling_names_a_current_one_and_is_not_one():
    for key, fragment in fragments().items():
        props = fields_of(fragment)
        for entry in fragment.get("x-old-spellings", []):
            if "value" in entry:
                enum = props[entry["key"]]["enum"]
                assert entry["now"] in enum and entry["value"] not in enum, (key, entry)
            else:
                assert entry["now"] in props and entry["key"] not in props, (key, entry)
                assert entry["now"] in vocabulary(), (key, entry)
    # The two fields that shared `resume` no longer share a name.
    assert all("resume" not in fields_of(fragments()[key]) for key in ("extractions", "checkpoints"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
