"""The validation cache: a state file that validated once is remembered by the hash of its bytes
and of the schema, so `diff` on an unchanged file imports neither ruamel.yaml nor jsonschema.
A cache is a hint, never an authority: an entry that cannot be read is as good as none.

What root applies must not come from anyone else: the cache's directories must be reconcile's
own (core/paths.py own_dir: owned by root or the invoking user, not group- or other-writable,
else the run is refused with one line), an entry is opened relative to its directory's
descriptor without following a link, and it is used only when its MAC is right: HMAC-SHA256
(RFC 2104) under a 32-byte key kept 0600 in the state directory (`cache.key`), not beside the
entries. Authenticating, not validating again, because validating again is what the cache exists
to avoid (ruamel.yaml and jsonschema are most of a `diff`'s start-up); and the key apart from
the cache, so that whoever can write the cache (a directory pointed elsewhere, a copied cache)
still cannot make an entry root accepts."""

from __future__ import annotations

import json
import os

from ...core.paths import UnsafeOwnFile, own_dir, state_dir, unsafe_why

KEY_NAME = "cache.key"
KEY_BYTES = 32
MAX_ENTRY = 64 * 2**20  # a state file is at most 4 MiB of YAML; its document as JSON stays well under this
_OPEN_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def cache_dir() -> str:
    explicit = os.environ.get("RECONCILE_CACHE_DIR")
    if explicit:
        return explicit
    if os.geteuid() == 0:
        return "/var/cache/reconcile"
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                        "reconcile")


def _entries_dir(create: bool) -> int:
    """The `validated` directory, held; both it and the cache directory checked (own_dir)."""
    top = cache_dir()
    os.close(own_dir(top, create=create))
    return own_dir(os.path.join(top, "validated"), create=create)


def mac(key: bytes, digest: str, body: dict) -> str:
    """HMAC-SHA256 (RFC 2104) of the entry's digest and canonical JSON, with the builtin SHA-256
    (`import hashlib`/`hmac` load OpenSSL: ~10 ms of every start-up, see schema.py)."""
    from .schema import sha256

    msg = digest.encode() + b"\0" + json.dumps(body, sort_keys=True, separators=(",", ":"),
                                               ensure_ascii=True).encode()
    padded = key.ljust(64, b"\0")  # (a key up to the block size is padded, not hashed)
    inner = sha256(bytes(b ^ 0x36 for b in padded) + msg).digest()
    return sha256(bytes(b ^ 0x5C for b in padded) + inner).hexdigest()


def _read_key(dfd: int, path: str) -> bytes | None:
    """The key, or None when there is none yet; UnsafeOwnFile when it is not reconcile's alone."""
    try:
        fd = os.open(KEY_NAME, _OPEN_READ, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeOwnFile(path, f"cannot be used as the validation cache's key: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        import stat

        why = unsafe_why(st, "the validation cache's key")
        if why is None and not stat.S_ISREG(st.st_mode):
            why = "the validation cache's key is not a regular file"
        if why is None and st.st_mode & 0o077:
            why = (f"the validation cache's key is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                   "refusing to trust it (remove it; a new one is made)")
        if why is not None:
            raise UnsafeOwnFile(path, why)
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    return key if len(key) == KEY_BYTES else None  # (being written: no key yet)


def _key(create: bool) -> bytes | None:
    """The key in the state directory; made there (O_EXCL, 0600, published with link(2) so it is
    never seen half-written) when `create` and there is none."""
    directory = state_dir()
    path = os.path.join(directory, KEY_NAME)
    try:
        dfd = own_dir(directory, create=create)
    except FileNotFoundError:
        return None
    try:
        key = _read_key(dfd, path)
        if key is not None or not create:
            return key
        tmp = f".{KEY_NAME}.{os.urandom(8).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(KEY_BYTES))
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, KEY_NAME, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                pass  # another reconcile made one first: theirs is the key
        finally:
            os.unlink(tmp, dir_fd=dfd)
        return _read_key(dfd, path)
    finally:
        os.close(dfd)


def read(digest: str) -> tuple[dict, list[tuple[int, int, str]]] | None:
    """The document validated under this digest and the warnings its validation found (line,
    column, message: old spellings, which a cached file must still say), or None: an entry that
    does not parse, was written for another digest, is not a state document, has no list of
    warnings (written by an older reconcile) or whose MAC is not right is as good as none (and
    is rewritten). UnsafeOwnFile when the cache's directories or its key are not reconcile's own."""
    try:
        dfd = _entries_dir(create=False)
    except UnsafeOwnFile:
        raise
    except OSError:  # no cache yet, or one this user cannot open: as good as none
        return None
    try:
        key = _key(create=False)
        if key is None:
            return None
        try:
            fd = os.open(f"{digest}.json", _OPEN_READ, dir_fd=dfd)
        except OSError:  # none, or a symlink (ELOOP): as good as none, and replaced when written
            return None
        try:
            import stat

            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or unsafe_why(st) is not None or st.st_size > MAX_ENTRY:
                return None
            with os.fdopen(os.dup(fd), "rb") as fh:
                entry = json.loads(fh.read(MAX_ENTRY + 1))
        finally:
            os.close(fd)
    except (ValueError, RecursionError):
        return None
    except UnsafeOwnFile:
        raise
    except OSError:
        return None
    finally:
        os.close(dfd)
    if not isinstance(entry, dict) or entry.get("key") != digest:
        return None
    doc, warnings, tag = entry.get("doc"), entry.get("warnings"), entry.get("mac")
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int) or not isinstance(warnings, list):
        return None
    if not all(isinstance(w, list) and len(w) == 3 and type(w[0]) is int and type(w[1]) is int
               and isinstance(w[2], str) for w in warnings):
        return None
    from _operator import _compare_digest  # hmac.compare_digest, without importing OpenSSL

    if not isinstance(tag, str) or not _compare_digest(tag, mac(key, digest, {"doc": doc, "warnings": warnings})):
        return None
    return doc, [(w[0], w[1], w[2]) for w in warnings]


def write(digest: str, doc: dict, warnings: list[tuple[int, int, str]]) -> None:
    """Best effort: a read-only cache only costs speed. The entry is made 0600 under a random
    name (O_EXCL, O_NOFOLLOW) in the held directory and renamed into place there.
    UnsafeOwnFile as `read`."""
    try:
        key = _key(create=True)
        if key is None:
            return
        dfd = _entries_dir(create=True)
    except UnsafeOwnFile:
        raise
    except OSError:
        return
    # The MAC is of the document as it will be read back (a YAML date written as its text).
    body = json.loads(json.dumps({"doc": doc, "warnings": [list(w) for w in warnings]}, default=str))
    data = json.dumps({"key": digest, **body, "mac": mac(key, digest, body)}).encode()
    name = f"{digest}.json"
    tmp = f".{name}.{os.urandom(8).hex()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    except OSError:
        pass
    finally:
        os.close(dfd)
