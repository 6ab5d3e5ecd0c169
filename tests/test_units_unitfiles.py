"""The in-process unit-file reader (reconcilers/units/syntax.py, unitfiles.py) without a running
systemd: the syntax rules on byte strings, and whole unit directories held against the offline
`systemctl --root=DIR is-enabled` (install.c's code in the systemctl binary; the live systemd is
the authority of tests/test_units_differential.py, where every layout is checked)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from reconcile_host.reconcilers.units.syntax import (
    Install,
    Unsure,
    hidden_or_backup,
    name_kind,
    parse_install,
    read_lines,
    systemd_refuses,
)
from reconcile_host.reconcilers.units.unitfiles import UnitFiles

SVC = b"[Unit]\nDescription=x\n[Service]\nExecStart=/bin/sleep infinity\n"
# [Install] sections and the state the reader gives a .service unit with no links to it (None:
# handed to systemd). tests/test_units.py checks every decided one against the live is-enabled.
INSTALL_CASES = [
    ("wanted", SVC + b"[Install]\nWantedBy=multi-user.target\n", "disabled"),
    ("required", SVC + b"[Install]\nRequiredBy=multi-user.target\n", "disabled"),
    ("no install section", SVC, "static"),
    ("alias only", SVC + b"[Install]\nAlias=other.service\n", "disabled"),
    ("alias words are not checked", SVC + b"[Install]\nAlias=not-a-name\n", "disabled"),
    ("also only", SVC + b"[Install]\nAlso=other.service\n", "indirect"),
    ("empty Also= is no reset", SVC + b"[Install]\nAlso=other.service\nAlso=\n", "indirect"),
    ("invalid Also= word: bad", SVC + b"[Install]\nAlso=other\n", None),
    ("empty assignment resets", SVC + b"[Install]\nWantedBy=multi-user.target\nWantedBy=\n", "static"),
    ("comments", SVC + b"[Install]\n#WantedBy=multi-user.target\n; WantedBy=x.target\n", "static"),
    ("section names are case-sensitive", SVC + b"[install]\nWantedBy=multi-user.target\n", "static"),
    ("install keys elsewhere are ignored", SVC + b"WantedBy=multi-user.target\n", "static"),
    ("spaces around", SVC + b"  [Install]  \n  WantedBy = multi-user.target  \n", "disabled"),
    ("continued ExecStart", b"[Service]\nExecStart=/bin/echo a \\\n  b\n[Install]\nWantedBy=a.target\n", "disabled"),
    ("continued line swallows the header", b"[Service]\nExecStart=/bin/echo a \\\n[Install]\nWantedBy=a.target\n",
     "static"),
    ("continuation in [Install]", SVC + b"[Install]\nWantedBy=multi-user.target \\\n  default.target\n", "disabled"),
    ("specifiers are not expanded in WantedBy=", SVC + b"[Install]\nWantedBy=%i.target\n", "disabled"),
    ("quotes", SVC + b'[Install]\nWantedBy="a.target"\n', None),
    ("UpheldBy= is unknown to systemd 252", SVC + b"[Install]\nUpheldBy=multi-user.target\n", "static"),
    ("no =", SVC + b"[Install]\nWantedBy\n", "static"),
    ("DefaultInstance= on a plain unit is ignored", SVC + b"[Install]\nDefaultInstance=%z\n", "static"),
    ("vertical tab does not end a line", SVC + b"[Install]\x0bWantedBy=a.target\n", None),
    ("form feed is no separator", SVC + b"[Install]\nWantedBy=a.target\x0cb.target\n", "disabled"),
    ("U+2028 does not end a line", SVC + "[Install]\u2028WantedBy=a.target\n".encode(), None),
    ("a no-break space is part of the key", SVC + "[Install]\nWantedBy\u00a0=a.target\n".encode(), "static"),
    ("carriage returns end lines", SVC.replace(b"\n", b"\r") + b"[Install]\rWantedBy=a.target\r", "disabled"),
    ("BOM", b"\xef\xbb\xbf" + SVC + b"[Install]\nWantedBy=a.target\n", "disabled"),
    ("BOM on a later line", SVC + b"\xef\xbb\xbf[Install]\nWantedBy=a.target\n", "disabled"),
    ("second BOM stays", b"\xef\xbb\xbf" + SVC + b"\xef\xbb\xbf[Install]\nWantedBy=a.target\n", "static"),
    ("invalid UTF-8 anywhere: bad", SVC.replace(b"=x", b"=\xff") + b"[Install]\nWantedBy=a.target\n", None),
    ("invalid UTF-8 in a comment", b"# \xff\n" + SVC + b"[Install]\nWantedBy=a.target\n", "disabled"),
    ("a noncharacter: bad", SVC.replace(b"=x", "=\ufdd0".encode()), None),
    ("quote in a section header: bad", SVC + b'[Ins"tall]\n', None),
    ("unterminated section header: bad", SVC + b"[Install\nWantedBy=a.target\n", None),
]


def state_of(data: bytes, utype: str = "service") -> str | None:
    try:
        info = parse_install(data, utype)
    except Unsure:
        return None
    return "disabled" if info.has_rules else "indirect" if info.also else "static"


@pytest.mark.parametrize("data,state", [c[1:] for c in INSTALL_CASES], ids=[c[0] for c in INSTALL_CASES])
def test_install_sections(data, state):
    assert state_of(data) == state


def test_alias_only_for_types_that_may_have_aliases():
    text = b"[Install]\nAlias=x\n"
    assert [state_of(text, t) for t in ("service", "socket", "mount", "automount", "swap", "slice", "scope")] == [
        "disabled", "disabled", "static", "static", "static", "static", "static"]


def test_drop_ins_add_to_the_unit_file_and_reset_it():
    info = parse_install(SVC + b"[Install]\nWantedBy=a.target\n", "service")
    parse_install(b"[Install]\nWantedBy=\n", "service", info)
    assert not info.has_rules
    assert isinstance(info, Install)


def test_read_lines_ends_as_systemd_does():
    assert read_lines(b"a\nb") == [b"a", b"b"]
    assert read_lines(b"a\r\nb\n\rc\n\n") == [b"a", b"b", b"c", b""]
    assert read_lines(b"a\r\n\x00b\x00\nc") == [b"a", b"b", b"", b"c"]
    assert read_lines(b"a\x0bb\x0cc\x1cd\xc2\x85e\xe2\x80\xa8f\n") == [b"a\x0bb\x0cc\x1cd\xc2\x85e\xe2\x80\xa8f"]
    assert read_lines(b"") == []
    assert read_lines(b"x" * (1 << 20)) is None


def test_unit_names():
    assert [name_kind(n) for n in ("a.service", "a@b.service", "a@.service", "a@b@c.service", ".h.service",
                                   "@a.service", "a.bogus", "a b.service", "é.service", "x" * 248 + ".service",
                                   "x" * 247 + ".service")] == [
        "plain", "instance", "template", "instance", "plain", None, None, None, None, None, "plain"]
    assert systemd_refuses("m@x.scope") and systemd_refuses("m@.mount") and not systemd_refuses("m@x.timer")
    assert [hidden_or_backup(n) for n in (".x.service", "x.service~", "x.conf.bak", "x.dpkg-old", "x.service")] == [
        True, True, True, True, False]


# --- whole directories, against the offline systemctl ------------------------------------------

SEARCH_PATH = ["/etc/systemd/system.control", "/run/systemd/system.control", "/run/systemd/transient",
               "/run/systemd/generator.early", "/etc/systemd/system", "/etc/systemd/system.attached",
               "/run/systemd/system", "/run/systemd/system.attached", "/run/systemd/generator",
               "/usr/local/lib/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system",
               "/run/systemd/generator.late"]
WANTED = SVC + b"[Install]\nWantedBy=multi-user.target\n"
DIRS = {"etc": "etc/systemd/system", "run": "run/systemd/system", "lib": "usr/lib/systemd/system",
        "local": "usr/local/lib/systemd/system", "transient": "run/systemd/transient"}


@pytest.fixture
def tree(tmp_path):
    if shutil.which("systemctl") is None:
        pytest.skip("systemctl not installed")
    for d in DIRS.values():
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "lib").symlink_to("usr/lib")  # merged /usr, as Debian 12

    def write(where: str, rel: str, data: bytes | None = None, link: str | None = None):
        path = tmp_path / DIRS[where] / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if link is not None:
            path.symlink_to(link)
        else:
            path.write_bytes(data)

    def offline(name: str) -> str:
        env = {**os.environ, "SYSTEMD_LOG_LEVEL": "err", "SYSTEMD_IGNORE_CHROOT": "1"}
        res = subprocess.run(["systemctl", f"--root={tmp_path}", "is-enabled", "--", name], capture_output=True,
                             text=True, env=env, timeout=30)
        return res.stdout.strip() or "error: " + res.stderr.strip()

    return write, (lambda: UnitFiles(SEARCH_PATH, root=str(tmp_path))), offline


def test_settled_units_are_what_systemctl_says(tree):
    write, files, offline = tree
    write("etc", "dis.service", WANTED)
    write("etc", "static.service", SVC)
    write("lib", "vendor.service", WANTED)
    write("local", "local.service", WANTED)
    write("etc", "en.service", WANTED)
    write("etc", "multi-user.target.wants/en.service", link="/etc/systemd/system/en.service")
    write("etc", "req.service", WANTED)
    write("etc", "foo.target.requires/req.service", link="../req.service")
    write("etc", "dangling.service", WANTED)  # links count by name: a link to nothing enables too
    write("etc", "x.target.wants/dangling.service", link="/nowhere/dangling.service")
    write("etc", "masked.service", link="/dev/null")
    write("run", "rtmasked.service", link="/dev/null")
    write("etc", "empty.service", b"")  # an empty unit file masks the unit
    write("run", "rt.service", WANTED)
    write("etc", "shadow.service", SVC)  # /etc comes first: the /run file does not count
    write("run", "shadow.service", WANTED)
    write("etc", "rtwant.service", WANTED)  # wanted from /run: enabled-runtime
    write("run", "multi-user.target.wants/rtwant.service", link="/etc/systemd/system/rtwant.service")
    write("lib", "vend.service", WANTED)  # a vendor .wants link does not enable a plain unit
    write("lib", "multi-user.target.wants/vend.service", link="../vend.service")
    write("etc", "real.service", WANTED)  # a link of another name to it: indirect
    write("etc", "other.service", link="/etc/systemd/system/real.service")
    write("etc", "aliased.service", SVC + b"[Install]\nAlias=aliased-a.service\n")  # its Alias= link: enabled
    write("etc", "aliased-a.service", link="/etc/systemd/system/aliased.service")
    write("etc", "hid.service", WANTED)  # hidden names are never read in .wants
    write("etc", "a.target.wants/.hid.service", link="/etc/systemd/system/hid.service")
    write("etc", ".b.target.wants/hid.service", link="/etc/systemd/system/hid.service")
    write("etc", "drop.service", SVC)  # drop-ins carry [Install] too
    write("etc", "drop.service.d/install.conf", b"[Install]\nWantedBy=multi-user.target\n")
    write("lib", "x-y-z.service", WANTED)  # prefix and type-wide drop-ins are the manager's only
    write("etc", "x-y-.service.d/install.conf", b"[Install]\nWantedBy=\n")
    write("etc", "typed.socket", b"[Socket]\nListenStream=1\n[Install]\nWantedBy=sockets.target\n")
    write("run", "socket.d/all.conf", b"[Install]\nWantedBy=\n")
    write("etc", "reset.service", WANTED)
    write("run", "reset.service.d/reset.conf", b"[Install]\nWantedBy=\n")
    write("etc", "hiddrop.service", SVC)
    write("etc", "hiddrop.service.d/.x.conf", b"[Install]\nWantedBy=a.target\n")
    write("etc", "m.mount", b"[Mount]\nWhat=/a\nWhere=/m\n[Install]\nAlias=n.mount\n")
    f = files()
    names = ["dis.service", "static.service", "vendor.service", "local.service", "en.service", "req.service",
             "dangling.service", "masked.service", "rtmasked.service", "empty.service", "rt.service",
             "shadow.service", "rtwant.service", "vend.service", "real.service", "aliased.service", "hid.service",
             "drop.service", "x-y-z.service", "typed.socket", "reset.service", "hiddrop.service", "m.mount"]
    mine = {n: (f.state(n) or ("(handed to systemd)",))[0] for n in names}
    assert mine == {n: offline(n) for n in names}
    assert set(mine.values()) >= {"enabled", "enabled-runtime", "disabled", "static", "indirect", "masked",
                                  "masked-runtime"}
    assert f.state("vendor.service") == ("disabled", "/lib/systemd/system/vendor.service")  # /lib first
    assert f.state("rtmasked.service") == ("masked-runtime", "/run/systemd/system/rtmasked.service")


def test_the_rest_is_handed_to_systemd(tree):
    write, files, offline = tree
    write("etc", "alias.service", link="/etc/systemd/system/real.service")
    write("etc", "real.service", WANTED)
    write("etc", "linked.service", link="/opt/units/linked.service")
    write("etc", "dir.service/x", b"")  # a directory named like a unit: bad
    write("lib", "dir.service", WANTED)
    write("etc", "badalso.service", SVC + b"[Install]\nAlso=nope\n")
    write("etc", "baddrop.service", WANTED)
    write("etc", "baddrop.service.d/x.conf/y", b"")  # a directory named like a drop-in: bad
    write("etc", "utf.service", SVC + b"[Install]\nWantedBy=\xff.target\n")
    write("etc", "t@.service", WANTED)
    write("transient", "tr.service", SVC)
    write("etc", "s.scope", b"[Scope]\n")
    f = files()
    for name in ("alias.service", "linked.service", "dir.service", "badalso.service", "baddrop.service",
                 "utf.service", "t@a.service", "tr.service", "ghost.service", "s.scope"):
        assert f.state(name) is None, name
    # and the reasons are real: systemd itself says bad (an error) or something the reader does not
    assert offline("dir.service").startswith("error: ") and offline("badalso.service").startswith("error: ")
    assert offline("utf.service").startswith("error: ") and offline("baddrop.service").startswith("error: ")
    assert offline("tr.service") == "transient" and offline("alias.service") == "alias"
