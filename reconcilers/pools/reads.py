"""Reading a Ceph cluster, in the observer child (the engine forks it and abandons it past the
kind's deadline, so a mon that never answers cannot hang reconcile).

Each cluster is read once for all its declared pools: `df detail`, `osd dump`, `osd df`,
`health detail`, and `pg ls-by-pool` per pool. Through librados' Python binding
(`Rados.mon_command`: one connection, the five answers in about 0.1 s) when it can be loaded,
else through the `ceph` CLI (one process per read, ~0.5 s each) with `--connect-timeout`: the
CLI waits 300 s for a mon by default (src/pybind/ceph_argparse.py, `ceph` --connect-timeout).
`rbd du` (the RBD images' provisioned sizes) only for a pool that declares max_overcommit, and
only when its numbers are current: with an OSD of the pool down it hangs.

Every read is a read: the commands are the `allow r` ones of src/mon/MonCommands.h and
src/mgr/MgrCommands.h, enough for a key with `mon 'allow r' mgr 'allow r'`.

Where python3-rados lives: Debian installs it for the system interpreter only
(/usr/lib/python3/dist-packages/rados.cpython-3XX-*.so). reconcile's own virtual environment
does not see that directory, so when `import rados` fails the module is loaded from there by
path, if one is built for this interpreter's ABI (importlib.machinery.EXTENSION_SUFFIXES). No
other module of dist-packages is put on the path. RECONCILE_CEPH_CLIENT=cli makes it use the CLI
(=rados: only the binding)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...core.host import CommandTimeout

if TYPE_CHECKING:
    from ...core.host import Host

CLIENT_ENV = "RECONCILE_CEPH_CLIENT"
DIST_PACKAGES = "/usr/lib/python3/dist-packages"
READS = {  # name -> the command, as `ceph` sends it (src/pybind/ceph_argparse.py builds the same JSON)
    "df": {"prefix": "df", "detail": "detail", "format": "json"},
    "osd_dump": {"prefix": "osd dump", "format": "json"},
    "osd_df": {"prefix": "osd df", "format": "json"},
    "health": {"prefix": "health", "detail": "detail", "format": "json"},
}
EACCES = 13


class ClusterError(Exception):
    """The cluster could not be read: unreachable, refused, or a read failed (Ceph's words)."""


def load_rados() -> Any | None:
    """librados' Python module, or None."""
    if os.environ.get(CLIENT_ENV) == "cli":
        return None
    try:
        import rados  # type: ignore[import-not-found]

        return rados
    except ImportError:
        pass
    import importlib.machinery
    import importlib.util
    import sys

    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(DIST_PACKAGES, "rados" + suffix)
        if suffix == ".so" or not os.path.isfile(path):
            continue
        spec = importlib.util.spec_from_file_location("rados", path)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError:
            return None
        sys.modules["rados"] = module
        return module
    return None


def where(cluster: Mapping[str, Any]) -> str:
    return f"client.{cluster['id']} with {cluster['conf']}"


def _cli_base(cluster: Mapping[str, Any], timeout: float) -> list[str]:
    argv = ["ceph", "-c", cluster["conf"], "--id", cluster["id"], "--connect-timeout", str(max(1, int(timeout)))]
    if cluster.get("keyring"):
        argv += ["--keyring", cluster["keyring"]]
    return argv


def _ceph_words(text: str) -> str:
    """The lines of Ceph's stderr that say what happened (not its keyring-search chatter)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = [ln for ln in lines if "unable to find a keyring" not in ln and "no keyring found" not in ln]
    return "; ".join(said[-2:]) or "no message"


class Cli:
    via = "ceph CLI"

    def __init__(self, host: Host, cluster: Mapping[str, Any], deadline: float):
        self.host, self.cluster, self.deadline = host, cluster, deadline

    def command(self, cmd: Mapping[str, Any]) -> Any:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ClusterError(f"no answer from the cluster ({where(self.cluster)}) within the observe_timeout")
        words = [*str(cmd["prefix"]).split(), *(str(v) for k, v in cmd.items() if k not in ("prefix", "format"))]
        argv = [*_cli_base(self.cluster, left), *words, "-f", "json"]
        try:
            res = self.host.run(argv, timeout=left + 2)
        except CommandTimeout:
            raise ClusterError(f"`ceph {cmd['prefix']}` did not answer within the observe_timeout "
                               f"({where(self.cluster)})") from None
        if res.returncode == 127:
            raise ClusterError("neither python3-rados nor the `ceph` CLI (ceph-common) is installed")
        if res.returncode == EACCES:
            raise ClusterError(f"the cluster refused client.{self.cluster['id']} (exit 13, permission denied: "
                               f"a wrong key or missing caps): {_ceph_words(res.stderr)}")
        if not res.ok:
            raise ClusterError(f"`ceph {cmd['prefix']}` exited {res.returncode} ({where(self.cluster)}): "
                               f"{_ceph_words(res.stderr)}")
        try:
            return json.loads(res.stdout)
        except ValueError:
            raise ClusterError(f"`ceph {cmd['prefix']}` answered no JSON: {res.stdout[:200]!r}") from None

    def close(self) -> None:
        pass


class Binding:
    via = "python3-rados"

    def __init__(self, rados: Any, cluster: Mapping[str, Any], deadline: float):
        self.rados, self.cluster, self.deadline = rados, cluster, deadline
        conf = {"keyring": cluster["keyring"]} if cluster.get("keyring") else {}
        left = max(1, int(deadline - time.monotonic()))
        try:
            self.handle = rados.Rados(conffile=cluster["conf"], rados_id=cluster["id"], conf=conf)
            # connect(timeout=) alone did not bound the mon hunt here (16.2.15: still waiting after 60 s
            # with no mon at mon_host); client_mount_timeout does (MonClient::authenticate's wait).
            self.handle.conf_set("client_mount_timeout", str(left))
            self.handle.conf_set("rados_mon_op_timeout", str(left))
            self.handle.connect(timeout=left)
        except rados.Error as exc:
            errno = getattr(exc, "errno", None)
            if errno == EACCES:
                raise ClusterError(f"the cluster refused client.{cluster['id']} ({exc}: a wrong key or missing "
                                   "caps)") from None
            raise ClusterError(f"cannot reach the cluster ({where(cluster)}): {exc}") from None

    def command(self, cmd: Mapping[str, Any]) -> Any:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ClusterError(f"no answer from the cluster ({where(self.cluster)}) within the observe_timeout")
        try:
            ret, out, outs = self.handle.mon_command(json.dumps(dict(cmd)), b"", timeout=max(1, int(left)))
        except self.rados.Error as exc:
            raise ClusterError(f"`ceph {cmd['prefix']}` failed ({where(self.cluster)}): {exc}") from None
        if ret == -EACCES:
            raise ClusterError(f"the cluster refused `ceph {cmd['prefix']}` to client.{self.cluster['id']} "
                               f"(permission denied): {outs}")
        if ret != 0:
            raise ClusterError(f"`ceph {cmd['prefix']}` failed ({where(self.cluster)}): {outs or os.strerror(-ret)}")
        try:
            return json.loads(out)
        except ValueError:
            raise ClusterError(f"`ceph {cmd['prefix']}` answered no JSON: {out[:200]!r}") from None

    def close(self) -> None:
        try:
            self.handle.shutdown()
        except Exception:  # noqa: BLE001 - a shutdown that fails changes nothing we read
            pass


def read_cluster(host: Host, cluster: Mapping[str, Any], pools: Sequence[str], timeout: float) -> dict[str, Any]:
    """The cluster's answers: {"via", "df", "osd_dump", "osd_df", "health", "pgs": {pool: answer}};
    ClusterError when it cannot be read."""
    deadline = time.monotonic() + timeout
    rados = None if os.environ.get(CLIENT_ENV) == "cli" else load_rados()
    if rados is None and os.environ.get(CLIENT_ENV) == "rados":
        raise ClusterError(f"{CLIENT_ENV}=rados but python3-rados cannot be loaded")
    client: Cli | Binding = Binding(rados, cluster, deadline) if rados is not None else Cli(host, cluster, deadline)
    try:
        out: dict[str, Any] = {"via": client.via}
        for name, cmd in READS.items():
            out[name] = client.command(cmd)
        out["pgs"] = {}
        for pool in pools:
            try:
                out["pgs"][pool] = client.command({"prefix": "pg ls-by-pool", "poolstr": pool, "format": "json"})
            except ClusterError as exc:
                out["pgs"][pool] = exc
        return out
    finally:
        client.close()


def rbd_du(host: Host, cluster: Mapping[str, Any], pool: str, timeout: float) -> Any:
    """`rbd du -p POOL --format json`, under the time left."""
    argv = ["rbd", "-c", cluster["conf"], "--id", cluster["id"], "--client_mount_timeout", str(max(1, int(timeout))),
            "--rados_osd_op_timeout", str(max(1, int(timeout)))]
    if cluster.get("keyring"):
        argv += ["--keyring", cluster["keyring"]]
    argv += ["du", "-p", pool, "--format", "json"]
    try:
        res = host.run(argv, timeout=max(1.0, timeout))
    except CommandTimeout:
        raise ClusterError(f"`rbd du -p {pool}` did not answer within the observe_timeout") from None
    if res.returncode == 127:
        raise ClusterError("`rbd` (ceph-common) is not installed: max_overcommit cannot be read")
    if not res.ok:
        raise ClusterError(f"`rbd du -p {pool}` exited {res.returncode}: {_ceph_words(res.stderr)}")
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise ClusterError(f"`rbd du -p {pool}` answered no JSON: {res.stdout[:200]!r}") from None
