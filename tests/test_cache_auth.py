"""The validation cache trusts an entry only with a right MAC: HMAC-SHA256 under a key of the
state directory. The MAC is held against Python's own hmac module; an entry another reconcile
wrote (another key), an edited document, or one without a MAC is validated again and rewritten;
the key is made 0600 and a key others can read is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import os

import pytest
from reconcile_host.core.paths import UnsafeOwnFile
from reconcile_host.pipeline.statefile import StateFileError, cache, load

STATE = "version: 1\nmounts:\n  /proc:\n    fstype: proc\n"
PLANTED = {"version": 1, "mounts": {"/planted": {"fstype": "tmpfs"}}}


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RECONCILE_STATE_DIR", str(tmp_path / "state"))
    state = tmp_path / "s.yaml"
    state.write_text(STATE)
    return state


def test_the_mac_is_rfc_2104_hmac_sha256():
    key = os.urandom(32)
    body = {"doc": {"version": 1, "x": [1, 2.5, None, "é"]}, "warnings": [[1, 2, "w"]]}
    msg = b"abc\0" + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert cache.mac(key, "abc", body) == hmac.new(key, msg, hashlib.sha256).hexdigest()


def only_entry(tmp_path):
    (entry,) = (tmp_path / "cache" / "validated").iterdir()
    return entry


def test_a_forged_entry_is_not_used_and_is_rewritten(dirs, tmp_path):
    first = load(dirs)
    entry = only_entry(tmp_path)
    good = json.loads(entry.read_text())
    key = (tmp_path / "state" / cache.KEY_NAME).read_bytes()
    assert good["mac"] == cache.mac(key, good["key"], {"doc": good["doc"], "warnings": good["warnings"]})
    body = {"doc": PLANTED, "warnings": []}
    forged = [
        {**good, "doc": PLANTED},  # the document edited, the MAC kept
        {"key": good["key"], **body},  # no MAC
        {"key": good["key"], **body, "mac": cache.mac(os.urandom(32), good["key"], body)},  # another key
        {"key": good["key"], **body, "mac": 5},
    ]
    for entry_doc in forged:
        entry.write_text(json.dumps(entry_doc))
        assert load(dirs).doc == first.doc  # validated again: the file's own document
        assert json.loads(entry.read_text()) == good  # and the entry rewritten with a right MAC


def test_an_entry_that_is_a_symlink_is_not_followed(dirs, tmp_path):
    first = load(dirs)
    entry = only_entry(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(entry.read_text())
    entry.unlink()
    entry.symlink_to(elsewhere)
    assert load(dirs).doc == first.doc
    assert not entry.is_symlink()  # replaced by an entry of its own (rename over the link)
    assert elsewhere.read_text() == entry.read_text()


def test_the_key_is_private_and_one_others_can_read_is_refused(dirs, tmp_path):
    load(dirs)
    key = tmp_path / "state" / cache.KEY_NAME
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == cache.KEY_BYTES
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    key.chmod(0o644)
    with pytest.raises(StateFileError) as exc:
        load(dirs)
    [line] = exc.value.problems
    assert line.startswith(f"{key}: the validation cache's key is readable by others (mode 0644): refusing to trust "
                           "it (remove it; a new one is made)")


def test_a_cache_directory_others_may_write_is_refused(dirs, tmp_path):
    (tmp_path / "cache").mkdir(mode=0o700)
    (tmp_path / "cache").chmod(0o777)
    with pytest.raises(StateFileError) as exc:
        load(dirs)
    [line] = exc.value.problems
    assert line.startswith(f"{tmp_path / 'cache'}: directory is writable by its group and others (mode 0777): "
                           "refusing to trust it (chmod go-w)")
    with pytest.raises(UnsafeOwnFile):
        cache.read("0" * 64)
