"""Where reconcile keeps its own files on a host: the journal and lock, the state directory of
the kinds (extraction check records, job pid files), the validation cache."""

from __future__ import annotations

import os


def default_journal_path() -> str:
    """/var/lib/reconcile/journal.jsonl as root, the XDG state directory otherwise."""
    if os.geteuid() == 0:
        return "/var/lib/reconcile/journal.jsonl"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "reconcile", "journal.jsonl")


def state_dir() -> str:
    """$RECONCILE_STATE_DIR if set, else the default journal's directory."""
    return os.environ.get("RECONCILE_STATE_DIR") or os.path.dirname(default_journal_path())


# --- reconcile's own directories and files: whose they may be ------------------------------
# OpenSSH's StrictModes (auth.c auth_secure_path) and systemd's CHASE_SAFE: a file root reads as
# its own instructions, or a directory it writes in, must not be one another user can write.

DIR_MODE = 0o700  # reconcile's own directories: the state directory, the cache, the spool


class UnsafeOwnFile(OSError):
    """One of reconcile's own files or directories is not safe to trust: str() is one line,
    `PATH: why (what to do)`."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def trusted_uids() -> frozenset[int]:
    """Whose files reconcile trusts as its own: root and the user it runs as; as root under
    sudo, also the user who ran sudo (SUDO_UID, set by sudo itself: only a process that is
    already root can set it in root's environment), whose own state file it was given."""
    uids = {0, os.geteuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo.isdigit():
        uids.add(int(sudo))
    return frozenset(uids)


def unsafe_why(st: os.stat_result, what: str = "file") -> str | None:
    """Why a file or directory with this stat is not one reconcile may trust, or None."""
    import stat

    if st.st_uid not in trusted_uids():
        whom = "root" if os.geteuid() == 0 else f"root or you (uid {os.geteuid()})"
        return f"{what} owned by uid {st.st_uid}, not by {whom}: refusing to trust it (another user could write it)"
    if st.st_mode & 0o022:
        who = {0o020: "its group", 0o002: "others"}.get(st.st_mode & 0o022, "its group and others")
        return (f"{what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}): refusing to trust it "
                f"(chmod go-w)")
    return None


def check_own(fd: int, path: str, what: str = "file") -> os.stat_result:
    """fstat an open file or directory of reconcile's own; UnsafeOwnFile unless safe."""
    st = os.fstat(fd)
    why = unsafe_why(st, what)
    if why is not None:
        raise UnsafeOwnFile(path, why)
    return st


def own_dir(path: str, *, create: bool = True) -> int:
    """A directory of reconcile's own, held by a descriptor the caller closes: made 0700 when
    missing (its missing parents as `mkdir -p` makes them), opened without following a symlink
    at its last component, and checked (check_own): another user's directory, or one they may
    write in, is refused (UnsafeOwnFile) rather than written in or read from."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if not create:
            raise
        parent = os.path.dirname(path.rstrip("/"))
        if parent:
            os.makedirs(parent, exist_ok=True)
        try:
            os.mkdir(path, DIR_MODE)  # never exist_ok: what is there is opened and checked below
        except FileExistsError:
            pass
        fd = os.open(path, flags)
    except OSError as exc:
        import errno

        if exc.errno == errno.ELOOP:
            raise UnsafeOwnFile(path, "a symlink stands where reconcile keeps its own directory: refusing to "
                                      "follow it") from None
        raise
    try:
        check_own(fd, path, "directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_state_dir() -> None:
    """The state directory, where it exists, is reconcile's own (own_dir); UnsafeOwnFile if not."""
    try:
        os.close(own_dir(state_dir(), create=False))
    except UnsafeOwnFile:
        raise
    except OSError:
        pass  # none yet, or not ours to open (EACCES): a kind that writes there says so itself


def spool_dir() -> str:
    """Where a check decompresses what it must read twice (a .gz content): beside reconcile's
    state, not in $TMPDIR, which any user may fill or plant names in."""
    return os.path.join(state_dir(), "spool")


def spool_file() -> int:
    """A read-write descriptor of a new, unnamed file in spool_dir() (O_TMPFILE: nothing to
    clean up, no name another process could open), or, where the filesystem lacks O_TMPFILE, a
    random name made O_EXCL|O_NOFOLLOW and unlinked at once. The caller closes it."""
    os.close(own_dir(state_dir()))  # (made 0700 too when missing, not as spool's parent by makedirs)
    dfd = own_dir(spool_dir())
    try:
        try:
            return os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        except (AttributeError, OSError) as exc:
            import errno

            if isinstance(exc, OSError) and exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
        name = f".spool-{os.urandom(8).hex()}"
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        os.unlink(name, dir_fd=dfd)
        return fd
    finally:
        os.close(dfd)
