"""The one way into a tree another user owns: a training run's directory, an extraction's output,
a mount's root. Whatever a user controls there is data — never a path root follows, a name root
trusts or a size root believes.

The shape is systemd's `chase()` (src/basic/chase.c) and tmpfiles' fd-based walk, the fix of
CVE-2018-6954:

- the declared root is opened once (`O_DIRECTORY`); everything below it is reached relative to
  directory fds, one component at a time with `O_NOFOLLOW` (or in one `openat2(2)` with
  `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` where the kernel has it, Linux >= 5.6): a symlink under the
  root is never followed, `..` and absolute names never leave it, and no path string is
  re-resolved between two steps (a directory swapped for a link after the first look is not
  entered: the fd already held is used);
- every open is `O_NONBLOCK` (a FIFO never hangs the observer) and is `fstat`ed before a byte is
  read: a regular file or a directory, else refused (a device is never read; a symlink to one is
  never opened);
- reads are bounded: a pointer file (DeepSpeed's `latest`, Megatron's tracker) is at most 4 KiB,
  a JSON file at most `JSON_LIMIT`;
- files reconcile creates are made under a random name with `O_CREAT | O_EXCL | O_NOFOLLOW` in a
  directory held by fd (mkstemp(3)'s rule) and renamed with `renameat(2)` (`renameat2(2)`'s
  `RENAME_NOREPLACE` where nothing may be replaced);
- the quarantine folder is made with `mkdirat(2)`; one that exists must be a real directory owned
  by reconcile's user and writable by no one else, or it is refused (a folder a user planted or
  swapped is never written into).

A refusal is `UnsafeTree`, an `OSError` whose text is one line naming what was found and where.
A symlink the framework itself writes (Lightning's `save_last="link"`) is read with `readlink`
and resolved lexically inside the root only (`readlink_inside`)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.atomic import make_unique

POINTER_LIMIT = 4096  # DeepSpeed's `latest`, Megatron's tracker: a tag or a number
JSON_LIMIT = 16 << 20  # trainer_state.json of a long run is a few MiB; an index.json of shards, less
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
DIR_FLAGS = _DIR  # a folder of the tree: opened with no link followed, never blocking
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

# openat2(2): include/uapi/linux/openat2.h; the syscall number is 437 on every architecture
# (the unified syscall table since Linux 5.6).
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_RENAME_NOREPLACE = 1


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc: Any = None
_openat2_ok: bool | None = None  # None: not tried yet


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


class UnsafeTree(OSError):  # noqa: N818 - an OSError: callers that handle I/O errors handle it too
    """A refusal: what was found where, in one line."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(errno.EPERM, f"{where}: {what}")
        self.where, self.what = where, what

    def __str__(self) -> str:
        return f"{self.where}: {self.what} (refused: reconcile follows no link and opens no special file "\
               "in a tree another user controls)"


def _parts(rel: str) -> list[str]:
    """REL's components; an absolute name or `..` is refused (never leaves the root)."""
    if rel.startswith("/"):
        raise UnsafeTree(rel, "an absolute name where a name under the root was expected")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeTree(rel, "`..` in a name under the root")
    return parts


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def _openat2(dir_fd: int, rel: str, flags: int) -> int:
    """One openat2(2) beneath DIR_FD with no symlink anywhere; -1 when the kernel lacks it."""
    global _openat2_ok
    if _openat2_ok is False:
        return -1
    how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _lib().syscall(_SYS_OPENAT2, dir_fd, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
    if fd >= 0:
        _openat2_ok = True
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM) and _openat2_ok is None:  # no openat2, or seccomp says no
        _openat2_ok = False
        return -1
    if err == errno.ELOOP:
        raise UnsafeTree(rel, "a symbolic link on the way")
    if err == errno.EXDEV:
        raise UnsafeTree(rel, "a name that leaves the root")
    raise OSError(err, os.strerror(err), rel)


def open_beneath(dir_fd: int, rel: str, flags: int) -> int:
    """An fd of REL beneath DIR_FD, no symlink followed on the way or at the end."""
    parts = _parts(rel)
    if not parts:
        return os.open(".", flags | os.O_NOFOLLOW, dir_fd=dir_fd)
    if len(parts) > 1:
        fd = _openat2(dir_fd, "/".join(parts), flags | os.O_NOFOLLOW)
        if fd >= 0:
            return fd
    cur, owned = dir_fd, False
    try:
        for p in parts[:-1]:
            nxt = _open_one(cur, p, _DIR, rel)
            if owned:
                os.close(cur)
            cur, owned = nxt, True
        return _open_one(cur, parts[-1], flags | os.O_NOFOLLOW, rel)
    finally:
        if owned:
            os.close(cur)


def _open_one(dir_fd: int, name: str, flags: int, rel: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EWOULDBLOCK):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                raise exc from None
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise UnsafeTree(rel, f"{_kind(st.st_mode)} (never followed or opened)") from None
        raise


_MAXSYMLINKS = 40  # the kernel's own limit on links in one lookup (fs/namei.c)
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def _unsafe_transition(a: os.stat_result, b: os.stat_result) -> bool:
    """systemd src/basic/chase.c unsafe_transition(): from a root-owned place any step is safe;
    from anyone else's, only to what the same uid owns."""
    return a.st_uid != 0 and a.st_uid != b.st_uid


def chase_safe(path: str) -> int:
    """An O_RDONLY|O_DIRECTORY fd of PATH, resolved one component at a time from `/` with O_PATH
    and no link followed by the kernel: systemd's chase() with CHASE_SAFE (src/basic/chase.c,
    "Detected unsafe path transition"). A link is followed by hand only if the directory holding
    it is root's or the link's owner's, an absolute link only if that owner is root (it restarts
    at `/`), and `..` only into a directory of the same owner (or out of root's): a user's link
    or `..` never leads root into a place the user does not own. Every step is taken from the fd
    the previous one gave: nothing is re-resolved, so a name swapped meanwhile changes nothing."""
    full = os.path.abspath(path)
    todo = [p for p in full.split("/") if p not in ("", ".")]
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    root_st = os.fstat(root)
    cur, st, links = os.dup(root), root_st, 0
    try:
        while todo:
            name = todo.pop(0)
            try:
                nxt = os.open(name, _PATH | (os.O_DIRECTORY if name == ".." else 0), dir_fd=cur)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, path) from None
            nst = os.fstat(nxt)
            if name == ".." and _unsafe_transition(st, nst):
                os.close(nxt)
                raise UnsafeTree(path, f"unsafe path transition: `..` out of a directory of uid {st.st_uid} "
                                       f"into one of uid {nst.st_uid}")
            if not stat.S_ISLNK(nst.st_mode):
                os.close(cur)
                cur, st = nxt, nst
                continue
            try:
                links += 1
                if links > _MAXSYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                sticky = st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWOTH
                if _unsafe_transition(st, nst) or (sticky and nst.st_uid not in (0, st.st_uid)):
                    # the second: the kernel's protected_symlinks (fs/namei.c may_follow_link), which
                    # a walk by hand would otherwise bypass: a user's link in /tmp is not root's to follow
                    raise UnsafeTree(path, f"unsafe path transition: {name!r} is a link of uid {nst.st_uid} "
                                           f"in a directory of uid {st.st_uid}")
                target = os.readlink("", dir_fd=nxt)  # readlinkat(2) on the O_PATH fd: this very link
            finally:
                os.close(nxt)
            if target.startswith("/"):
                if _unsafe_transition(nst, root_st):
                    raise UnsafeTree(path, f"unsafe path transition: {name!r}, a link of uid {nst.st_uid}, "
                                           f"names {target!r} (from a user's link into root's tree: declare the "
                                           "directory it names instead)")
                os.close(cur)
                cur, st = os.dup(root), root_st
            todo[:0] = [p for p in target.split("/") if p not in ("", ".")]
        try:
            return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=cur)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None
    finally:
        os.close(cur)
        os.close(root)


@dataclass(frozen=True)
class Entry:
    """One name in a directory, as lstat sees it (a link is a link, never what it names)."""

    name: str
    kind: str  # file | dir | symlink | other
    size: int
    mtime: float
    mtime_ns: int
    uid: int


def _entry(name: str, st: os.stat_result) -> Entry:
    m = st.st_mode
    kind = "file" if stat.S_ISREG(m) else "dir" if stat.S_ISDIR(m) else "symlink" if stat.S_ISLNK(m) else "other"
    return Entry(name, kind, st.st_size, st.st_mtime, st.st_mtime_ns, st.st_uid)


class Tree:
    """A directory of a user's tree, held by fd. `path` is for messages only, never re-opened."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.path = fd, path

    @classmethod
    def open(cls, path: str) -> Tree:
        """The declared root. Its own path is the administrator's (it may pass through a link such
        as /data -> /mnt/nvme, written in the state file by root); a link on it is followed only
        where that is a safe path transition (`chase_safe`): never a user's link into a place of
        root's or another user's (a run directory that is a link the user made to /etc is refused)."""
        return cls(chase_safe(path), path)

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _where(self, rel: str) -> str:
        return os.path.join(self.path, rel) if rel not in ("", ".") else self.path

    def subdir(self, rel: str) -> Tree:
        fd = open_beneath(self.fd, rel, _DIR)
        return Tree(fd, self._where(rel))

    def lstat(self, rel: str) -> os.stat_result:
        parts = _parts(rel)
        if len(parts) <= 1:
            return os.stat(parts[0] if parts else ".", dir_fd=self.fd, follow_symlinks=False)
        with self.subdir("/".join(parts[:-1])) as d:
            return os.stat(parts[-1], dir_fd=d.fd, follow_symlinks=False)

    def entries(self, rel: str = ".") -> list[Entry]:
        """The names of a directory with lstat's view of each (sorted by name)."""
        sub = self if rel in ("", ".") else self.subdir(rel)
        try:
            out = []
            with os.scandir(sub.fd) as it:
                for e in it:
                    try:
                        out.append(_entry(e.name, e.stat(follow_symlinks=False)))
                    except FileNotFoundError:
                        continue
            return sorted(out, key=lambda e: e.name)
        finally:
            if sub is not self:
                sub.close()

    def open_regular(self, rel: str) -> int:
        """A read-only fd of a regular file under the tree (the caller closes it)."""
        fd = open_beneath(self.fd, rel, _FILE)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise UnsafeTree(self._where(rel), f"{_kind(st.st_mode)} where a regular file was expected")
        return fd

    def read_bounded(self, rel: str, limit: int) -> bytes:
        """The whole of a regular file of at most LIMIT bytes; a larger one is refused, not cut."""
        fd = self.open_regular(rel)
        try:
            if os.fstat(fd).st_size > limit:
                raise UnsafeTree(self._where(rel), f"larger than {limit} bytes")
            chunks, got = [], 0
            while True:
                b = os.read(fd, min(65536, limit + 1 - got))
                if not b:
                    break
                chunks.append(b)
                got += len(b)
                if got > limit:  # grew while read
                    raise UnsafeTree(self._where(rel), f"larger than {limit} bytes")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def read_pointer(self, rel: str, limit: int = POINTER_LIMIT) -> str:
        return self.read_bounded(rel, limit).decode("utf-8", "replace")

    def read_json(self, rel: str, limit: int = JSON_LIMIT) -> Any:
        return json.loads(self.read_bounded(rel, limit))

    def readlink_inside(self, rel: str) -> str:
        """What a framework's own symlink names, as a name under the root; a target that is absolute
        or leaves the root is refused. Resolved lexically: the target's own components are then
        opened with no link followed."""
        parts = _parts(rel)
        parent = "/".join(parts[:-1])
        with self.subdir(parent) if parent else Tree(os.dup(self.fd), self.path) as d:
            target = os.readlink(parts[-1], dir_fd=d.fd)
        if target.startswith("/"):
            raise UnsafeTree(self._where(rel), f"a link to an absolute name ({target!r}), outside the tree")
        out: list[str] = parts[:-1]
        for p in target.split("/"):
            if p in ("", "."):
                continue
            if p == "..":
                if not out:
                    raise UnsafeTree(self._where(rel), f"a link that leaves the tree ({target!r})")
                out.pop()
            else:
                out.append(p)
        return "/".join(out)

    def _parent(self, rel: str) -> tuple[Tree, str, bool]:
        parts = _parts(rel)
        if not parts:
            raise UnsafeTree(self._where(rel), "no name")
        if len(parts) == 1:
            return self, parts[0], False
        return self.subdir("/".join(parts[:-1])), parts[-1], True

    def write_atomic(self, rel: str, data: bytes, *, mode: int = 0o600, replace: bool = True,
                     owner: tuple[int, int] | None = None) -> None:
        """REL replaced (or, replace=False, created) whole: a random name made O_EXCL|O_NOFOLLOW in
        the parent held by fd, written, fsync'd, chowned to OWNER (a file the user's job reads back
        stays theirs), renamed with renameat, the directory fsync'd."""

        def fill(fd: int) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]

        self._publish(rel, fill, mode, replace, owner)

    def copy_atomic(self, src_rel: str, dst_rel: str, *, replace: bool = True,
                    owner: tuple[int, int] | None = None) -> None:
        """A regular file of the tree copied to DST_REL through held fds (never what a link names)."""
        src = self.open_regular(src_rel)
        try:
            st = os.fstat(src)

            def fill(out: int) -> None:
                left = st.st_size
                while left > 0:
                    n = os.sendfile(out, src, None, min(left, 1 << 30))
                    if n == 0:
                        break
                    left -= n

            self._publish(dst_rel, fill, stat.S_IMODE(st.st_mode) & 0o755, replace, owner)
        finally:
            os.close(src)

    def _publish(self, rel: str, fill: Callable[[int], None], mode: int, replace: bool,
                 owner: tuple[int, int] | None) -> None:
        """The one way a file appears in the tree: made under a random name, FILL writes it, its
        owner and mode set on the fd, fsync'd, renamed over REL with renameat, the folder fsync'd."""
        d, name, own = self._parent(rel)
        try:
            tmp = _new_temp(d.fd, name, 0o600)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d.fd)
                try:
                    fill(fd)
                    if owner is not None and os.geteuid() == 0:
                        os.fchown(fd, *owner)
                    os.fchmod(fd, mode)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                _rename(d.fd, tmp, d.fd, name, replace)
            except BaseException:
                _unlink_quiet(d.fd, tmp)
                raise
            os.fsync(d.fd)
        finally:
            if own:
                d.close()

    def symlink_atomic(self, target: str, rel: str, *, owner: tuple[int, int] | None = None) -> None:
        """REL made a relative symbolic link to TARGET (a name in the same tree), replacing REL."""
        d, name, own = self._parent(rel)
        try:
            tmp, _ = make_unique(name, lambda t: os.symlink(target, t, dir_fd=d.fd))
            try:
                if owner is not None and os.geteuid() == 0:
                    os.chown(tmp, *owner, dir_fd=d.fd, follow_symlinks=False)
                _rename(d.fd, tmp, d.fd, name, True)
            except BaseException:
                _unlink_quiet(d.fd, tmp)
                raise
            os.fsync(d.fd)
        finally:
            if own:
                d.close()

    def owner(self) -> tuple[int, int]:
        st = os.fstat(self.fd)
        return st.st_uid, st.st_gid


def _new_temp(dir_fd: int, name: str, mode: int) -> str:
    """A new empty file with a name nobody can predict (mkstemp(3)'s rule), in DIR_FD."""
    tmp, fd = make_unique(name, lambda t: os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                                  | os.O_CLOEXEC, mode & 0o777, dir_fd=dir_fd))
    os.close(fd)
    return tmp


def _unlink_quiet(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _rename(src_fd: int, src: str, dst_fd: int, dst: str, replace: bool) -> None:
    """renameat(2); with replace=False renameat2(RENAME_NOREPLACE), or link+unlink where the file
    system or the C library lacks it (link(2) never replaces either)."""
    if replace:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    fn = getattr(_lib(), "renameat2", None)
    if fn is not None:
        rc = fn(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), dst)
    os.link(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
    os.unlink(src, dir_fd=src_fd)


def rename_between(src: Tree, src_name: str, dst: Tree, dst_name: str, *, replace: bool = False) -> None:
    """Move one entry between two held directories (the same file system): renameat, never
    re-resolving either side's path."""
    if "/" in src_name or "/" in dst_name or src_name in ("", ".", "..") or dst_name in ("", ".", ".."):
        raise UnsafeTree(f"{src.path}/{src_name}", "a move names one entry of a held directory")
    _rename(src.fd, src_name, dst.fd, dst_name, replace)


def read_in(folder: str, name: str, limit: int) -> bytes:
    """NAME of FOLDER, a folder a user's tree holds (a checkpoint, a step), read bounded: FOLDER's
    parent is opened, then FOLDER and NAME with no link followed."""
    parent, base = os.path.split(os.path.normpath(folder))
    with Tree.open(parent or ".") as t:
        return t.read_bounded(f"{base}/{name}", limit)


def open_file(path: str) -> int:
    """A read-only fd of the regular file PATH in a user's tree (a checkpoint's file): its folder
    reached as `chase_safe` allows, the file itself opened with no link followed, never blocking,
    and fstat'ed as a regular file (else UnsafeTree). The caller closes it."""
    parent, base = os.path.split(os.path.abspath(path))
    with Tree(chase_safe(parent), parent) as t:
        return t.open_regular(base)
