"""A real systemd (PID 1 of its own PID+mount+UTS namespace) for tests.

The test machines run as root but without systemd as PID 1.  systemd is
installed, though, and boots fine as PID 1 of a fresh PID namespace::

    with NamespacedSystemd() as nsd:
        nsd.write_unit("demo.service", "[Service]\\nExecStart=/bin/sleep infinity\\n")
        nsd.systemctl("start", "demo.service", check=True)
        nsd.wait_active("demo.service")

Isolation, and what is deliberately *not* isolated:

* ``/run`` and ``/etc/systemd/system`` are private tmpfs mounts, so the host's
  enabled units are invisible and nothing written there reaches the host.
* The root filesystem (``/tmp``, ``/etc``, ``/var``, the project's virtualenv)
  is shared with the host.  That is intended: pytest's ``tmp_path`` is
  visible inside.  It is also why every unit with host-wide side effects is
  masked before boot -- above all ``systemd-tmpfiles-setup.service``, which
  would empty the host's ``/tmp``.
* All generators are masked (``/run/systemd/system-generators``): the sysv,
  fstab and postgresql generators would otherwise create units for the host's
  services.  Boot is faster and deterministic as a result.
* ``/sys/fs/cgroup`` is a private tmpfs with bind mounts of the host's
  hierarchies: systemd remounts that tmpfs read-write and adds directories to
  it, which on the host's own tmpfs would outlive the namespace.
* ``NamespacedSystemd(vendor_dirs=True)`` also makes the host's vendor unit
  directories writable inside the namespace only: overlays (upper layers on a
  tmpfs of the namespace) on ``/usr/lib/systemd/system``, ``/usr/local/lib``
  (with ``systemd/system`` created in it) and ``/etc/systemd`` (with
  ``system.attached`` and ``system.control``), and a tmpfs on ``/srv``; a
  marker file written through each proves, after boot, that the host does not
  see it.
* The network namespace and ``/dev`` are the host's.
* Services' stdout/stderr default to ``null`` (journald is masked).  A unit
  that needs its output can say ``StandardOutput=append:/abs/path``.
* systemd's own log (``--log-target=console``) goes to ``self.log_path``:
  a PID-1 systemd always (re)opens ``/dev/console`` and requires a tty there,
  so a pty is bind-mounted over the namespace's ``/dev/console`` and a thread
  copies it into the file.

PIDs: ``.pid`` is the host PID of the namespace's systemd.  Everything systemd
reports (``MainPID`` ...) is a PID inside the namespace; map it with
``host_pid_of``.

Teardown is ``SIGKILL`` to systemd (``SIGTERM`` makes a PID-1 systemd
re-execute instead of exiting); the kernel then kills every process of the
namespace.  Only PIDs this object started are ever signalled.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

SYSTEMD = "/lib/systemd/systemd"
CGROUP_HIERARCHIES = ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")
GENERATOR_DIRS = (
    "/usr/lib/systemd/system-generators",
    "/lib/systemd/system-generators",
    "/usr/local/lib/systemd/system-generators",
    "/etc/systemd/system-generators",
)

# Units masked (symlinked to /dev/null) before boot: everything that would act
# on the host (shared root fs, /dev, /proc/sys, clock, hostname files) or that
# needs journald/udev/dbus, which we do not run.
MASKED_UNITS = (
    # Would wipe the host's /tmp (D /tmp with --remove) -- the important one.
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-tmpfiles-clean.service",
    "systemd-remount-fs.service",
    "systemd-sysctl.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    "systemd-modules-load.service",
    "kmod-static-nodes.service",
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",  # would symlink the host's /dev/log
    "systemd-journald-audit.socket",
    "systemd-journal-flush.service",
    "systemd-journal-catalog-update.service",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-hwdb-update.service",
    "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service",
    "systemd-update-done.service",
    "systemd-sysusers.service",
    "systemd-firstboot.service",
    "systemd-machine-id-commit.service",
    "systemd-random-seed.service",
    "systemd-repart.service",
    "systemd-pcrphase.service",
    "systemd-pcrphase-sysinit.service",
    "systemd-fsck-root.service",
    "systemd-pstore.service",
    "systemd-timesyncd.service",  # would set the host's clock
    "systemd-logind.service",  # needs dbus
    "systemd-user-sessions.service",
    "systemd-boot-check-no-failures.service",
    "ldconfig.service",
    "dev-hugepages.mount",
    "dev-mqueue.mount",
    "sys-fs-fuse-connections.mount",
    "sys-kernel-config.mount",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "tmp.mount",
    "systemd-ask-password-console.path",
    "systemd-ask-password-wall.path",
    "systemd-initctl.socket",
    "dbus.socket",
    "dbus.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "man-db.timer",
    "logrotate.timer",
    "packagekit-offline-update.service",
    "swap.target",
    "getty.target",
)

# Written into /run/systemd/system.conf.d.  Accounting is off because the
# cgroup-v1 controllers are the host's; the short stop timeout keeps a
# misbehaving unit from stalling a test for the default 90 s.
SYSTEM_CONF = """\
[Manager]
DefaultCPUAccounting=no
DefaultIOAccounting=no
DefaultIPAccounting=no
DefaultBlockIOAccounting=no
DefaultMemoryAccounting=no
DefaultTasksAccounting=no
DefaultStandardOutput=null
DefaultStandardError=inherit
DefaultTimeoutStartSec=30s
DefaultTimeoutStopSec=10s
"""

INIT_SH = """\
#!/bin/sh
# First process of the namespace (PID 1): prepare, then exec systemd.
set -eu

# A cgroup of our own in both hierarchies, so systemd builds its tree there
# and not at the top of the host's hierarchies.
for h in {hierarchies}; do
    mkdir -p "$h/{cgroup}"
    echo $$ > "$h/{cgroup}/cgroup.procs"
done

# A PID-1 systemd logs to /dev/console, not to its stderr: give it a pty
# whose other end the host copies into the log file.
mount --bind {console} /dev/console

mount -t tmpfs -o mode=0755 tmpfs /run

# systemd remounts /sys/fs/cgroup read-write and creates directories and
# symlinks in it (cpu,cpuacct, net_cls, ...), and that tmpfs is the host's.
# Replace it by a private tmpfs holding bind mounts of the host's hierarchies.
mkdir /run/host-cgroup
mount --rbind /sys/fs/cgroup /run/host-cgroup
mount -t tmpfs -o mode=0755 tmpfs /sys/fs/cgroup
for e in /run/host-cgroup/*; do
    if [ -L "$e" ]; then
        cp -P "$e" /sys/fs/cgroup/
    elif mountpoint -q "$e"; then
        mkdir "/sys/fs/cgroup/${{e##*/}}"
        mount --bind "$e" "/sys/fs/cgroup/${{e##*/}}"
    fi
done
umount -R /run/host-cgroup
rmdir /run/host-cgroup

mkdir -p /run/systemd/system.conf.d /run/systemd/system-generators
cp {conf} /run/systemd/system.conf.d/50-reconcile-test.conf

# Mask every generator: a same-named /dev/null link in /run wins.
for d in {generator_dirs}; do
    [ -d "$d" ] || continue
    for g in "$d"/*; do
        [ -e "$g" ] || continue
        ln -sfn /dev/null "/run/systemd/system-generators/${{g##*/}}"
    done
done

{vendor_dirs}
mount -t tmpfs -o mode=0755 tmpfs /etc/systemd/system
for u in {masked}; do
    ln -s /dev/null "/etc/systemd/system/$u"
done
# Units staged with write_unit() before start(), then our boot target.
cp -a {staged}/. /etc/systemd/system/

export container={container}
exec {systemd} --system --unit={target} --log-target=console --log-color=no \\
    --show-status=no
"""

# vendor_dirs=True: the host's directories that tests may then write inside the namespace, each
# the lower layer of an overlay whose upper layer is on a tmpfs of the namespace (never the host's).
OVERLAID = ("/etc/systemd", "/usr/lib/systemd/system", "/usr/local/lib")
VENDOR_DIRS_SH = """\
mkdir -p /run/nsystemd-overlay
mount -t tmpfs -o mode=0700 tmpfs /run/nsystemd-overlay
i=0
for d in {overlaid}; do
    [ -d "$d" ] || {{ echo "nsystemd: $d missing: not overlaid" >&2; exit 1; }}
    i=$((i + 1))
    o="/run/nsystemd-overlay/$i"
    mkdir "$o" "$o/upper" "$o/work"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$o/upper,workdir=$o/work" "$d"
done
[ -d /srv ] || {{ echo "nsystemd: /srv missing" >&2; exit 1; }}
mount -t tmpfs -o mode=0755 tmpfs /srv
mkdir -p /usr/local/lib/systemd/system /etc/systemd/system.attached /etc/systemd/system.control
"""

BOOT_TARGET = """\
[Unit]
Description=Boot target of the namespaced test systemd
Wants=multi-user.target
After=multi-user.target
AllowIsolate=yes
"""

SYSTEMCTL_ENV = {"SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "LC_ALL": "C"}


def children_of(parent: int) -> list[tuple[int, str]]:
    """(pid, comm) of every process whose parent is ``parent``, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Field 4 is the PPID; the comm field (in parentheses) may contain spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append((int(entry), stat[stat.index("(") + 1: stat.rindex(")")]))
    return found


class NamespacedSystemdError(RuntimeError):
    """Boot or teardown of the namespaced systemd failed."""


class NamespacedSystemd:
    """systemd 252 as PID 1 of a fresh PID+mount+UTS namespace (needs root).

    An instance boots once; create a new one to boot again.

    Attributes after ``start()``:
      pid          host PID of the namespace's systemd
      root         ``Path('/proc/<pid>/root')``: the namespace's mount view
      unit_dir     ``root / 'etc/systemd/system'`` (tmpfs)
      log_path     systemd's console log; ``stop()`` deletes it with the work
                   directory unless ``keep_logs`` (kept when boot fails)
      boot_state   ``running`` or ``degraded``
      boot_seconds seconds from spawn until ``is-system-running`` settled
      failed_units ``systemctl --failed --no-legend`` output when degraded
    """

    def __init__(self, name: str = "reconcile-test", vendor_dirs: bool = False):
        self.name = name
        self.vendor_dirs = vendor_dirs
        self.target = f"{name}.target"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        self.log_path = self.workdir / "console.log"
        self._staged = self.workdir / "units"
        self._staged.mkdir()
        (self._staged / self.target).write_text(BOOT_TARGET)
        # Unique per instance: a session-wide namespace and a test's own one
        # may coexist.
        self.cgroup = f"{name}-{uuid.uuid4().hex[:8]}"
        self.pid: int | None = None
        self._unshare: subprocess.Popen | None = None
        self._console: tuple[int, int] | None = None  # pty (master, slave)
        self._console_thread: threading.Thread | None = None
        self._units: set[str] = set()
        self.boot_hostname: str | None = None
        self.boot_state: str | None = None
        self.boot_seconds: float | None = None
        self.failed_units = ""

    # -- lifecycle ---------------------------------------------------------

    @staticmethod
    def missing_prerequisites() -> str | None:
        """Why this machine cannot run a NamespacedSystemd, or None."""
        if os.geteuid() != 0:
            return "needs root"
        for tool in ("unshare", "nsenter", "setpriv"):
            if shutil.which(tool) is None:
                return f"{tool} not found"
        if not os.access(SYSTEMD, os.X_OK):
            return f"{SYSTEMD} not found"
        for h in CGROUP_HIERARCHIES:
            if not os.path.isdir(h):
                return f"cgroup hierarchy {h} not mounted"
        return None

    @property
    def root(self) -> Path:
        return Path(f"/proc/{self._require_pid()}/root")

    @property
    def unit_dir(self) -> Path:
        return self.root / "etc/systemd/system" if self.pid else self._staged

    def start(self, timeout: float = 20) -> NamespacedSystemd:
        """Boot; return once ``is-system-running`` says running or degraded."""
        if self._unshare is not None or not self.workdir.exists():
            raise NamespacedSystemdError("an instance boots once; create a new one")
        why = self.missing_prerequisites()
        if why:
            raise NamespacedSystemdError(why)
        conf = self.workdir / "system.conf"
        conf.write_text(SYSTEM_CONF)
        self._open_console()
        init = self.workdir / "init.sh"
        init.write_text(
            INIT_SH.format(
                console=shlex.quote(os.ttyname(self._console[1])),
                hierarchies=" ".join(CGROUP_HIERARCHIES),
                cgroup=self.cgroup,
                conf=shlex.quote(str(conf)),
                generator_dirs=" ".join(GENERATOR_DIRS),
                masked=" ".join(MASKED_UNITS),
                vendor_dirs=VENDOR_DIRS_SH.format(overlaid=" ".join(OVERLAID)) if self.vendor_dirs else "",
                staged=shlex.quote(str(self._staged)),
                container=shlex.quote(self.name),
                systemd=SYSTEMD,
                target=shlex.quote(self.target),
            )
        )
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            # start_new_session: setsid, so no terminal signals reach it.
            # Safety nets should this process die without stop(): setpriv
            # makes unshare die with us, --kill-child makes systemd (and so
            # the whole namespace) die with unshare.
            self._unshare = subprocess.Popen(
                [
                    "setpriv",
                    "--pdeathsig",
                    "KILL",
                    "unshare",
                    "--pid",
                    "--fork",
                    "--kill-child=SIGKILL",
                    "--mount",
                    "--uts",
                    "--mount-proc",
                    "--propagation",
                    "private",
                    "/bin/sh",
                    str(init),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self.pid = self._find_child(self._unshare.pid, t0 + timeout)
            self._wait_booted(t0 + timeout)
        except BaseException:
            self.stop(keep_logs=True)
            raise
        self.boot_seconds = time.monotonic() - t0
        self.boot_hostname = self.run(["hostname"], check=True).stdout.strip()
        if self.vendor_dirs:
            try:
                self._check_private(("/srv", *OVERLAID))
            except BaseException:
                self.stop(keep_logs=True)
                raise
        return self

    def _check_private(self, dirs) -> None:
        """A marker written into each directory inside the namespace must not reach the host."""
        for d in dirs:
            marker = f".nsystemd-marker-{uuid.uuid4().hex}"
            inside = self.root / d.lstrip("/") / marker
            inside.write_text("")
            try:
                if os.path.lexists(os.path.join(d, marker)):
                    raise NamespacedSystemdError(f"{d}: a write inside the namespace reached the host")
                if not inside.exists():
                    raise NamespacedSystemdError(f"{d}: the marker vanished inside the namespace")
            finally:
                inside.unlink()

    def stop(self, keep_logs: bool = False) -> None:
        """Kill the namespace (SIGKILL to its PID 1), remove its cgroups and,
        unless ``keep_logs``, the work directory with the log."""
        if self._unshare is not None:
            if self._unshare.poll() is None:
                pid = self.pid or self._child_of(self._unshare.pid)
                try:
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                    else:  # not forked yet: --kill-child covers a racing fork
                        self._unshare.kill()
                except ProcessLookupError:
                    pass
            try:
                # unshare exits once its child (systemd) is gone.
                self._unshare.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._unshare.kill()  # our own unshare process only
                self._unshare.wait(timeout=10)
            self._unshare = None
        self.pid = None
        self._units.clear()
        self._close_console()
        self._remove_cgroups()
        if not keep_logs:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> NamespacedSystemd:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _open_console(self) -> None:
        master, slave = os.openpty()
        self._console = (master, slave)

        def copy() -> None:
            with open(self.log_path, "ab") as log:
                while True:
                    try:
                        data = os.read(master, 65536)
                    except OSError:  # EIO: the last slave fd was closed
                        return
                    if not data:
                        return
                    log.write(data.replace(b"\r\n", b"\n"))
                    log.flush()

        # Must keep draining: a full pty buffer would block systemd.
        self._console_thread = threading.Thread(target=copy, name=f"{self.name}-console", daemon=True)
        self._console_thread.start()

    def _close_console(self) -> None:
        if self._console is None:
            return
        master, slave = self._console
        os.close(slave)  # the namespace is dead: ours was the last slave fd
        self._console_thread.join(timeout=5)
        os.close(master)
        self._console = None

    def _require_pid(self) -> int:
        if self.pid is None:
            raise NamespacedSystemdError("namespace not started")
        return self.pid

    @staticmethod
    def _child_of(parent: int) -> int | None:
        """Host PID of a child of ``parent``, or None."""
        return next((pid for pid, _comm in children_of(parent)), None)

    def _find_child(self, parent: int, deadline: float) -> int:
        """Wait for the process `unshare --fork` creates (our PID 1)."""
        while True:
            pid = self._child_of(parent)
            if pid is not None:
                return pid
            if self._unshare.poll() is not None or time.monotonic() > deadline:
                raise NamespacedSystemdError(
                    f"unshare did not start the namespace (rc={self._unshare.poll()})\n"
                    f"--- tail of {self.log_path} ---\n{self.log_tail()}"
                )
            time.sleep(0.01)

    def _wait_booted(self, deadline: float) -> None:
        state = ""
        while time.monotonic() < deadline:
            if self._unshare.poll() is not None:
                break
            # Before systemd is up this fails (no /run/systemd/private yet).
            try:
                state = self.systemctl("is-system-running", timeout=5).stdout.strip()
            except subprocess.TimeoutExpired:
                state = "timeout"
            if state in ("running", "degraded"):
                self.boot_state = state
                if state == "degraded":
                    self.failed_units = self.systemctl("--failed", "--no-legend").stdout
                return
            time.sleep(0.05)
        raise NamespacedSystemdError(
            f"systemd did not boot (last is-system-running: {state!r}, "
            f"unshare rc={self._unshare.poll()})\n"
            f"--- tail of {self.log_path} ---\n{self.log_tail()}"
        )

    def _remove_cgroups(self) -> None:
        """rmdir our cgroup trees, deepest first.

        The namespace's processes may still be exiting right after the kill,
        which makes rmdir fail with EBUSY for a moment: retry briefly.
        """
        deadline = time.monotonic() + 10
        for h in CGROUP_HIERARCHIES:
            top = Path(h) / self.cgroup
            while top.exists():
                try:
                    for dirpath, _dirs, _files in os.walk(top, topdown=False):
                        os.rmdir(dirpath)
                except FileNotFoundError:
                    continue
                except OSError:
                    if time.monotonic() > deadline:
                        raise NamespacedSystemdError(f"cannot remove cgroup {top}") from None
                    time.sleep(0.05)

    # -- running things inside ----------------------------------------------

    def _nsenter(self, argv: list[str], cwd: str | None = None) -> list[str]:
        cmd = ["nsenter", "-t", str(self._require_pid()), "-m", "-p", "-u"]
        if cwd is not None:
            cmd.append(f"--wd={cwd}")  # nsenter -m would otherwise chdir to /
        return [*cmd, "--", *argv]

    def popen(self, argv: list[str], cwd: str | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` inside the namespace; returns the Popen of nsenter.

        nsenter forks (it must, to enter the PID namespace) and does not
        forward signals.  The Popen runs in a new session by default, so
        ``os.killpg(p.pid, sig)`` reaches the command as well as nsenter.
        """
        kw.setdefault("start_new_session", True)
        return subprocess.Popen(self._nsenter(argv, cwd), **kw)

    def run(
        self,
        argv: list[str],
        check: bool = False,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        input: str | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the namespace (mount+PID+UTS), text mode.

        ``env`` replaces the environment, as for subprocess.  Without ``cwd``
        the command runs in ``/``: pass absolute paths.  On timeout the whole
        process group (nsenter and the command) is killed.
        """
        proc = self.popen(
            argv,
            cwd=cwd,
            env=env,
            text=True,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def systemctl(self, *args: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
        """``systemctl --no-pager ARGS`` against the namespace's systemd."""
        return self.run(
            ["systemctl", "--no-pager", *args], check=check, timeout=timeout, env={**os.environ, **SYSTEMCTL_ENV}
        )

    def set_hostname(self, name: str) -> None:
        """Set the namespace's host name (its own UTS namespace)."""
        self.run(["hostname", name], check=True)

    # -- units --------------------------------------------------------------

    def write_unit(self, name: str, text: str, enable: bool = False, wanted_by: str = "multi-user.target") -> Path:
        """Write a unit into the namespace's /etc/systemd/system; daemon-reload.

        ``enable`` creates the ``<wanted_by>.wants/<name>`` link; it does not
        start the unit.  Called before ``start()``, the unit is staged and
        copied in before boot, so an enabled one starts at boot (the boot
        target pulls in multi-user.target).  Returns the host-side path.
        """
        path = self.unit_dir / name
        if path.is_symlink():  # e.g. a mask: do not write through it
            path.unlink()
        path.write_text(text)
        if enable:
            wants = self.unit_dir / f"{wanted_by}.wants"
            wants.mkdir(exist_ok=True)
            link = wants / name
            if link.is_symlink():
                link.unlink()
            # Absolute target, resolved by systemd inside the namespace.
            link.symlink_to(f"/etc/systemd/system/{name}")
        self._units.add(name)
        if self.pid is not None:
            self.systemctl("daemon-reload", check=True)
        return path

    def remove_unit(self, name: str) -> None:
        """Stop the unit (errors ignored), delete it, its links, drop-ins and
        any mask; daemon-reload and reset-failed."""
        self.systemctl("stop", name)
        udir = self.unit_dir
        for link in udir.glob(f"*.wants/{name}"):
            link.unlink()
        for link in udir.glob(f"*.requires/{name}"):
            link.unlink()
        path = udir / name
        if path.is_symlink() or path.exists():
            path.unlink()
        shutil.rmtree(udir / f"{name}.d", ignore_errors=True)
        self._units.discard(name)
        self.systemctl("daemon-reload", check=True)
        self.systemctl("reset-failed", name)

    def reset(self) -> None:
        """Undo a test's changes: remove units written via write_unit,
        restore the boot host name, reset-failed."""
        for name in sorted(self._units):
            self.remove_unit(name)
        if self.boot_hostname:
            self.set_hostname(self.boot_hostname)
        self.systemctl("reset-failed")

    # -- state --------------------------------------------------------------

    def show(self, unit: str, prop: str) -> str:
        """``systemctl show -p PROP --value UNIT`` (raises if systemctl fails)."""
        return self.systemctl("show", "-p", prop, "--value", unit, check=True).stdout.strip()

    def wait_state(self, unit: str, state: str, timeout: float = 10) -> None:
        """Poll ActiveState until it equals ``state``; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            current = self.show(unit, "ActiveState")
            if current == state:
                return
            if time.monotonic() > deadline:
                status = self.systemctl("status", unit).stdout
                raise TimeoutError(f"{unit}: ActiveState {current!r}, wanted {state!r}\n{status}")
            time.sleep(0.05)

    def wait_active(self, unit: str, timeout: float = 10) -> None:
        self.wait_state(unit, "active", timeout)

    def main_pid(self, unit: str) -> int:
        """MainPID of ``unit`` as a PID *inside the namespace* (0 if none)."""
        return int(self.show(unit, "MainPID"))

    def host_pid_of(self, ns_pid: int) -> int:
        """Map a PID inside the namespace to its host PID (via NSpid)."""
        ns = os.readlink(f"/proc/{self._require_pid()}/ns/pid")
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                    continue
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                # "NSpid:\t<host pid>\t<pid in the namespace>"
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return int(entry)
        raise ProcessLookupError(f"no process {ns_pid} in the namespace")
