#!/usr/bin/env python3
# ruff: noqa: E501  (one layout a line: file contents are easier to read unbroken)
"""Writes layouts.yaml: unit-file layouts for a differential test against the real systemd.

Each layout says which files, directories and symlinks to create (paths relative to the
root of the namespace) and which units to ask about. It never says what systemd answers:
the test asks the live systemd. Run `python3 make_layouts.py > layouts.yaml`.

The first group is a re-expression of the layouts of systemd's own
test/test-systemctl-enable.sh (v252.38; see README.md); the rest cover classes added
here. Files outside the unit search path (upstream: the root directory "/") live under
/srv/linked here, so that a test can give them a private tmpfs in the namespace.
"""

from __future__ import annotations

import base64
import sys

ETC = "etc/systemd/system"
RUN = "run/systemd/system"
USR = "usr/lib/systemd/system"
LOCAL = "usr/local/lib/systemd/system"
SRV = "srv/linked"  # out of the search path; upstream uses "/"
UP = "test/test-systemctl-enable.sh"

LAYOUTS: list[dict] = []
_IDS: set[str] = set()


def f(path: str, content: str | bytes) -> dict:
    return {"path": path, "content": content}


def ln(path: str, target: str) -> dict:
    return {"path": path, "symlink": target}


def d(path: str) -> dict:
    return {"path": path, "dir": True}


def layout(id: str, files: list[dict], units: list[str], source: str = "", note: str = "") -> None:
    assert id not in _IDS, id
    _IDS.add(id)
    entry = {"id": id, "source": source or "issue-14", "files": files, "units": units}
    if note:
        entry["note"] = note
    LAYOUTS.append(entry)


# A unit body that the manager can load: tests then also see LoadState=loaded.
SVC = "[Unit]\nDescription=differential test unit\n\n[Service]\nType=oneshot\nExecStart=/bin/true\n"
SVC_B = SVC.encode()


def svc(install: str = "", body: str = SVC) -> str:
    return body + ("\n[Install]\n" + install if install else "")


# ----------------------------------------------------------------------------------------------
# 1. Upstream: test/test-systemctl-enable.sh at v252.38. Line ranges refer to that file. Where
#    the script runs `systemctl enable`, a second layout makes by hand the links the script then
#    checks for (its `test -h` / `islink` lines), so that both the state before and after are
#    asked about. Contents are those of the script's here-documents.
# ----------------------------------------------------------------------------------------------

T1 = "[Install]\nWantedBy=default.target\nRequiredBy=special.target\n"
T1_ALIASES = T1 + (
    "Alias=test1-goodalias.service\n"
    "Alias=test1@badalias.service\n"
    "Alias=test1-badalias.target\n"
    "Alias=test1-badalias.socket\n"
    "# we have a series of good, bad, and then good again\n"
    "Alias=test1-goodalias2.service\n"
)
T1_LINKS = [
    ln(f"{ETC}/default.target.wants/test1.service", "/etc/systemd/system/test1.service"),
    ln(f"{ETC}/special.target.requires/test1.service", "/etc/systemd/system/test1.service"),
]

layout("up-enable-nonexistent", [d(ETC)], ["test1.service"], f"{UP}:23-24")
layout("up-basic-enablement", [f(f"{ETC}/test1.service", T1)], ["test1.service"], f"{UP}:26-32")
layout("up-basic-enablement-enabled", [f(f"{ETC}/test1.service", T1), *T1_LINKS], ["test1.service"],
       f"{UP}:34-36")
layout("up-enable-when-link-exists", [
    f(f"{ETC}/test1.service", T1),
    ln(f"{ETC}/default.target.wants/test1.service", "/usr/lib/systemd/system/test1.service"),
    ln(f"{ETC}/special.target.requires/test1.service", "/usr/lib/systemd/system/test1.service"),
], ["test1.service"], f"{UP}:46-53", "wants/requires links point to a path where there is no file")
layout("up-aliases", [f(f"{ETC}/test1.service", T1_ALIASES)],
       ["test1.service", "test1-goodalias.service", "test1-goodalias2.service"], f"{UP}:80-88")
layout("up-aliases-enabled", [
    f(f"{ETC}/test1.service", T1_ALIASES), *T1_LINKS,
    ln(f"{ETC}/test1-goodalias.service", "/etc/systemd/system/test1.service"),
    ln(f"{ETC}/test1-goodalias2.service", "/etc/systemd/system/test1.service"),
], ["test1.service", "test1-goodalias.service", "test1-goodalias2.service"], f"{UP}:90-98")
layout("up-aliases-link-exists", [
    f(f"{ETC}/test1a.service", "[Install]\nAlias=test1a-alias.service\n"),
    ln(f"{ETC}/test1a-alias.service", "/usr/lib/systemd/system/test1a.service"),
], ["test1a.service", "test1a-alias.service"], f"{UP}:115-121", "the alias link dangles")
layout("up-aliases-link-exists-enabled", [
    f(f"{ETC}/test1a.service", "[Install]\nAlias=test1a-alias.service\n"),
    ln(f"{ETC}/test1a-alias.service", "/etc/systemd/system/test1a.service"),
], ["test1a.service", "test1a-alias.service"], f"{UP}:115-124")
T2S = "[Install]\nWantedBy=sockets.target\nAlso=test2.service\n"
T2V = "[Install]\nWantedBy=default.target\nAlso=test2.socket\n"
layout("up-also-units", [f(f"{ETC}/test2.socket", T2S), f(f"{ETC}/test2.service", T2V)],
       ["test2.service", "test2.socket"], f"{UP}:129-140")
layout("up-also-units-enabled", [
    f(f"{ETC}/test2.socket", T2S), f(f"{ETC}/test2.service", T2V),
    ln(f"{ETC}/default.target.wants/test2.service", "/etc/systemd/system/test2.service"),
    ln(f"{ETC}/sockets.target.wants/test2.socket", "/etc/systemd/system/test2.socket"),
], ["test2.service", "test2.socket"], f"{UP}:142-148")
L1 = "[Install]\nWantedBy=paths.target\n"
layout("up-link-target-missing", [ln(f"{ETC}/link1.path", "/srv/linked/link1.path")], ["link1.path"],
       f"{UP}:155-159", "upstream's `link` fails here; this is the dangling link it would have made")
layout("up-link", [f(f"{SRV}/link1.path", L1), ln(f"{ETC}/link1.path", "/srv/linked/link1.path")],
       ["link1.path"], f"{UP}:161-167")
layout("up-link-different-path", [
    f(f"{SRV}/link1.path", L1), f(f"{SRV}/subdir/link1.path", L1),
    ln(f"{ETC}/link1.path", "/srv/linked/link1.path"),
], ["link1.path"], f"{UP}:173-177")
layout("up-link-bad-suffix", [
    f(f"{SRV}/link1.path", L1), f(f"{SRV}/subdir/link1.suffix", L1),
], ["link1.path"], f"{UP}:179-182", "nothing linked: link1.suffix is not a unit name")
layout("up-link-and-enable", [
    f(f"{SRV}/link1.path", L1),
    ln(f"{ETC}/link1.path", "/srv/linked/link1.path"),
    ln(f"{ETC}/paths.target.wants/link1.path", "/srv/linked/link1.path"),
], ["link1.path"], f"{UP}:201-204")
layout("up-enabled-link-only-in-wants", [
    f(f"{SRV}/link1.path", L1),
    ln(f"{ETC}/paths.target.wants/link1.path", "/srv/linked/link1.path"),
], ["link1.path"], f"{UP}:222-225", "state between the two removals upstream checks")
L3 = "[Install]\nWantedBy=services.target\n"
layout("up-manual-link", [f(f"{SRV}/link3.suffix", L3), ln(f"{ETC}/link3.service", "/srv/linked/link3.suffix")],
       ["link3.service"], f"{UP}:249-256", "a link named link3.service to a file not named as a unit")
layout("up-manual-link-enabled", [
    f(f"{SRV}/link3.suffix", L3), ln(f"{ETC}/link3.service", "/srv/linked/link3.suffix"),
    ln(f"{ETC}/services.target.wants/link3.service", "/srv/linked/link3.suffix"),
], ["link3.service"], f"{UP}:258-260")
layout("up-enable-on-masked", [ln(f"{ETC}/masked.service", "/dev/null")], ["masked.service"], f"{UP}:266-269")
layout("up-enable-on-masked-alias", [
    ln(f"{ETC}/masked.service", "/dev/null"), ln(f"{ETC}/masked-alias.service", "masked.service"),
], ["masked.service", "masked-alias.service"], f"{UP}:271-275")
L5A = "[Install]\nWantedBy=services.target\nAlso=link5.service\n"
L5 = "[Install]\nWantedBy=services.target\nAlso=link5-also.service\n"
layout("up-issue-22000-link-in-subdirectory", [
    f(f"{ETC}/link5-also.service", L5A), f(f"{ETC}/myown.d/link5.service", L5),
], ["link5.service", "link5-also.service"], f"{UP}:277-288",
    "link5.service only in a subdirectory that is not in the search path")
layout("up-issue-22000-enabled", [
    f(f"{ETC}/link5-also.service", L5A), f(f"{ETC}/myown.d/link5.service", L5),
    ln(f"{ETC}/services.target.wants/link5-also.service", "/etc/systemd/system/link5-also.service"),
], ["link5.service", "link5-also.service"], f"{UP}:294-296")
TP1 = "[Install]\nWantedBy=services.target\n"
layout("up-template", [f(f"{ETC}/templ1@.service", TP1)], ["templ1@one.service", "templ1@two.service"],
       f"{UP}:298-306", "upstream also asks about the template templ1@.service itself")
layout("up-template-one-enabled", [
    f(f"{ETC}/templ1@.service", TP1),
    ln(f"{ETC}/services.target.wants/templ1@one.service", "/etc/systemd/system/templ1@.service"),
], ["templ1@one.service", "templ1@two.service"], f"{UP}:308-310")
layout("up-template-one-two-enabled", [
    f(f"{ETC}/templ1@.service", TP1),
    ln(f"{ETC}/services.target.wants/templ1@one.service", "/etc/systemd/system/templ1@.service"),
    ln(f"{ETC}/services.target.wants/templ1@two.service", "/etc/systemd/system/templ1@.service"),
], ["templ1@one.service", "templ1@two.service", "templ1@three.service"], f"{UP}:312-315")
TP1D = ("[Install]\n# check enablement with\nWantedBy=services.target services.target\n"
        "RequiredBy=other@templ1.target other@%p.target\nDefaultInstance=333\n")
layout("up-template-default-instance", [f(f"{ETC}/templ1@.service", TP1D)],
       ["templ1@333.service", "templ1@one.service"], f"{UP}:327-334")
TP1D_333 = [
    ln(f"{ETC}/services.target.wants/templ1@333.service", "/etc/systemd/system/templ1@.service"),
    ln(f"{ETC}/other@templ1.target.requires/templ1@333.service", "/etc/systemd/system/templ1@.service"),
]
layout("up-template-default-instance-enabled", [f(f"{ETC}/templ1@.service", TP1D), *TP1D_333],
       ["templ1@333.service", "templ1@one.service"], f"{UP}:336-339")
layout("up-template-default-instance-one-two-enabled", [
    f(f"{ETC}/templ1@.service", TP1D), *TP1D_333,
    ln(f"{ETC}/services.target.wants/templ1@one.service", "/etc/systemd/system/templ1@.service"),
    ln(f"{ETC}/other@templ1.target.requires/templ1@one.service", "/etc/systemd/system/templ1@.service"),
    ln(f"{ETC}/services.target.wants/templ1@two.service", "/etc/systemd/system/templ1@.service"),
    ln(f"{ETC}/other@templ1.target.requires/templ1@two.service", "/etc/systemd/system/templ1@.service"),
], ["templ1@333.service", "templ1@one.service", "templ1@two.service"], f"{UP}:348-355")
layout("up-template-default-instance-one-disabled", [
    f(f"{ETC}/templ1@.service", TP1D), *TP1D_333,
    ln(f"{ETC}/services.target.wants/templ1@two.service", "/etc/systemd/system/templ1@.service"),
    ln(f"{ETC}/other@templ1.target.requires/templ1@two.service", "/etc/systemd/system/templ1@.service"),
], ["templ1@333.service", "templ1@one.service", "templ1@two.service"], f"{UP}:357-364")
layout("up-removal-of-relative-enablement-symlinks", [
    f(f"{ETC}/templ1@.service", TP1D),
    ln(f"{ETC}/services.target.wants/templ1@one.service", "../templ1@one.service"),
    ln(f"{ETC}/services.target.wants/templ1@two.service", "templ1@two.service"),
    ln(f"{ETC}/services.target.wants/templ1@three.service", "../templ1@.service"),
    ln(f"{ETC}/services.target.wants/templ1@four.service", "templ1@.service"),
    ln(f"{ETC}/services.target.wants/templ1@five.service", "/usr/lib/systemd/system/templ1@.service"),
    ln(f"{ETC}/services.target.wants/templ1@six.service", "/etc/systemd/system/templ1@.service"),
    ln(f"{ETC}/services.target.wants/templ1@seven.service", "/run/system/templ1@.service"),
], [f"templ1@{n}.service" for n in ("one", "two", "three", "four", "five", "six", "seven", "eight")],
    f"{UP}:375-384")
TP2 = "[Install]\nRequiredBy=another-template@.target\n"
layout("up-template-for-another-template", [f(f"{ETC}/templ2@.service", TP2)],
       ["templ2@two.service", "templ2@other.service"], f"{UP}:396-400")
layout("up-template-for-another-template-enabled", [
    f(f"{ETC}/templ2@.service", TP2),
    ln(f"{ETC}/another-template@.target.requires/templ2@.service", "/etc/systemd/system/templ2@.service"),
    ln(f"{ETC}/another-template@.target.requires/templ2@two.service", "/etc/systemd/system/templ2@.service"),
], ["templ2@two.service", "templ2@other.service"], f"{UP}:402-407")
layout("up-template-for-another-template-only-template-link", [
    f(f"{ETC}/templ2@.service", TP2),
    ln(f"{ETC}/another-template@.target.requires/templ2@.service", "/etc/systemd/system/templ2@.service"),
], ["templ2@two.service", "templ2@other.service"], f"{UP}:413-415")
L4 = ("[Install]\nAlias=link4.service\nAlias=link4@.service\nAlias=link4@inst.service\n"
      "Alias=link4alias.service\nAlias=link4alias2.service\n")
layout("up-aliases-with-and-without-instance", [f(f"{ETC}/link4.service", L4)],
       ["link4.service", "link4alias.service", "link4@inst.service"], f"{UP}:421-430")
layout("up-aliases-with-and-without-instance-enabled", [
    f(f"{ETC}/link4.service", L4),
    ln(f"{ETC}/link4alias.service", "/etc/systemd/system/link4.service"),
    ln(f"{ETC}/link4alias2.service", "/etc/systemd/system/link4.service"),
], ["link4.service", "link4alias.service", "link4alias2.service", "link4@inst.service"], f"{UP}:432-437")
L4B = "[Install]\nAlias=link4alias.service\nAlias=link4alias2.service\n"
layout("up-enable-on-path-to-unit-file", [f(f"{ETC}/link4.service", L4B)], ["link4.service"], f"{UP}:446-451")
layout("up-enable-on-path-to-unit-file-enabled", [
    f(f"{ETC}/link4.service", L4B),
    ln(f"{ETC}/link4alias.service", "/etc/systemd/system/link4.service"),
    ln(f"{ETC}/link4alias2.service", "/etc/systemd/system/link4.service"),
], ["link4.service", "link4alias.service"], f"{UP}:453-457")
L5B = "[Install]\nAlias=link5.service\nAlias=link5alias.service\nAlias=link5alias2.service\n"
layout("up-issue-661-enable-on-unit-file", [f(f"{ETC}/link5.service", L5B)], ["link5.service"], f"{UP}:464-471")
layout("up-issue-661-enable-on-unit-file-enabled", [
    f(f"{ETC}/link5.service", L5B),
    ln(f"{ETC}/link5alias.service", "/etc/systemd/system/link5.service"),
    ln(f"{ETC}/link5alias2.service", "/etc/systemd/system/link5.service"),
], ["link5.service", "link5alias.service", "link5alias2.service"], f"{UP}:473-476")
L5C = "[Install]\nAlias=link5copy.service\nAlias=link5alias.service\nAlias=link5alias2.service\n"
layout("up-issue-661-link", [f(f"{SRV}/link5copy.service", L5C),
                             ln(f"{ETC}/link5copy.service", "/srv/linked/link5copy.service")],
       ["link5copy.service"], f"{UP}:482-496")
layout("up-issue-661-link-and-enable", [
    f(f"{SRV}/link5copy.service", L5C),
    ln(f"{ETC}/link5copy.service", "/srv/linked/link5copy.service"),
    ln(f"{ETC}/link5alias.service", "/srv/linked/link5copy.service"),
    ln(f"{ETC}/link5alias2.service", "/srv/linked/link5copy.service"),
], ["link5copy.service", "link5alias.service", "link5alias2.service"], f"{UP}:507-510",
    "alias links that point outside the search path: linked unit files, not aliases (upstream FIXME)")
L5P = ("[Install]\nWantedBy=target5@.target\nRequiredBy=target5@.target\n"
       "WantedBy=target5@inst.target\nRequiredBy=target5@inst.target\n")
layout("up-issue-19437-plain-templates-in-wants", [f(f"{ETC}/link5@.path", L5P)],
       ["link5@inst.path"], f"{UP}:517-525", "upstream asks about the template link5@.path")
layout("up-issue-19437-plain-templates-in-wants-enabled", [
    f(f"{ETC}/link5@.path", L5P),
    ln(f"{ETC}/target5@.target.wants/link5@.path", "/etc/systemd/system/link5@.path"),
    ln(f"{ETC}/target5@.target.requires/link5@.path", "/etc/systemd/system/link5@.path"),
    ln(f"{ETC}/target5@inst.target.wants/link5@.path", "/etc/systemd/system/link5@.path"),
    ln(f"{ETC}/target5@inst.target.requires/link5@.path", "/etc/systemd/system/link5@.path"),
], ["link5@inst.path"], f"{UP}:527-532")
ML = "[Install]\nWantedBy=multilink.target\n"
layout("up-symlinks-not-listed-in-install", [
    f(f"{ETC}/multilink.mount", ML),
    ln(f"{ETC}/default.target.wants/multilink.mount", "../multilink.mount"),
    ln(f"{ETC}/multilink-alias.mount", "../multilink.mount"),
    ln(f"{ETC}/multilink-badalias.service", "../multilink.mount"),
], ["multilink.mount", "multilink-alias.mount", "multilink-badalias.service"], f"{UP}:541-552")
layout("up-symlinks-not-listed-in-install-after-disable", [f(f"{ETC}/multilink.mount", ML)],
       ["multilink.mount"], f"{UP}:554-558")

# merge 20017: specifiers in Alias= of a template socket (check_alias, lines 564-572). Only
# specifiers whose value does not depend on the host (os-release, machine-id, boot id, uname)
# are ported; the instance asked about is some-some-link6@inst.socket.
for spec, why in [("p", "prefix"), ("n", "full name"), ("N", "name without suffix"), ("i", "instance"),
                  ("j", "last component of prefix"), ("g", "group"), ("G", "gid"), ("u", "user"),
                  ("U", "uid"), ("%", "'%' is not legal in a unit name"), ("z", "%z is not defined"),
                  ("C", "not available in [Install]"), ("E", "not available in [Install]"),
                  ("f", "not available in [Install]"), ("h", "not available in [Install]"),
                  ("t", "not available in [Install]"), ("s", "not available in [Install]")]:
    sid = {"%": "percent"}.get(spec, spec if spec.islower() else spec.lower() + "-upper")
    layout(f"up-specifier-alias-{sid}", [
        f(f"{ETC}/some-some-link6@.socket", f"[Install]\nAlias=target@{spec}:%{spec}.socket\n"),
    ], ["some-some-link6@inst.socket"], f"{UP}:564-662", f"Alias= with %{spec} ({why})")
layout("up-specifier-alias-p-enabled", [
    f(f"{ETC}/some-some-link6@.socket", "[Install]\nAlias=target@p:%p.socket\n"),
    ln(f"{ETC}/target@p:some-some-link6.socket", "/etc/systemd/system/some-some-link6@.socket"),
], ["some-some-link6@inst.socket", "target@p:some-some-link6.socket"], f"{UP}:564-572,653",
    "the link check_alias p expects (a plain name pointing to a template)")
L7 = ("[Install]\nWantedBy=target@%p.target\nWantedBy=another-target@.target\n"
      "RequiredBy=target2@%p.target\nRequiredBy=another-target2@.target\n")
layout("up-specifiers-in-wantedby", [f(f"{ETC}/some-some-link7.socket", L7)], ["some-some-link7.socket"],
       f"{UP}:664-674")
layout("up-specifiers-in-wantedby-enabled", [
    f(f"{ETC}/some-some-link7.socket", L7),
    ln(f"{ETC}/target@some-some-link7.target.wants/some-some-link7.socket", "/etc/systemd/system/some-some-link7.socket"),
    ln(f"{ETC}/another-target@.target.wants/some-some-link7.socket", "/etc/systemd/system/some-some-link7.socket"),
    ln(f"{ETC}/target2@some-some-link7.target.requires/some-some-link7.socket", "/etc/systemd/system/some-some-link7.socket"),
    ln(f"{ETC}/another-target2@.target.requires/some-some-link7.socket", "/etc/systemd/system/some-some-link7.socket"),
], ["some-some-link7.socket"], f"{UP}:676-680")

# ----------------------------------------------------------------------------------------------
# 2. The classes added here.
# ----------------------------------------------------------------------------------------------

# 2a. Also= words that are not valid unit names (config_parse_also -> install_info_add).
for i, (word, why) in enumerate([
    ("other", "no suffix"), ("other.bogus", "unknown unit type"), ('"other.service"', "quotes are kept (no unquoting)"),
    ("dir/other.service", "a slash"), ("@other.service", "@ first"), (".service", "nothing before the suffix"),
    ("oth*er.service", "a glob character"), ("%z.service", "unknown specifier"), ("x" * 250 + ".service", "256+ chars"),
    ("good.service bad", "a valid word then an invalid one"), ("ot\u00e9her.service", "a non-ASCII letter"),
]):
    layout(f"also-invalid-{i:02d}", [f(f"{ETC}/a14.service", svc(f"WantedBy=multi-user.target\nAlso={word}\n"))],
           ["a14.service"], note=f"Also= word: {why}")
layout("also-invalid-only", [f(f"{ETC}/a14.service", svc("Also=other\n"))], ["a14.service"],
       note="no rules, only an invalid Also=")
layout("also-valid-template-word", [f(f"{ETC}/a14.service", svc("Also=other@.service\n"))], ["a14.service"])
layout("also-specifier-p", [f(f"{ETC}/a14.service", svc("Also=%p-helper.socket\n"))], ["a14.service"])
layout("also-empty-resets", [f(f"{ETC}/a14.service", svc("Also=other.service\nAlso=\n"))], ["a14.service"],
       note="Also= with an empty value does not reset the list (config_parse_also has no reset)")

# 2b. Alias= words that are not valid names or do not fit the unit.
for i, (word, why) in enumerate([
    ("other", "no suffix"), ("other.bogus", "unknown unit type"), ("other.socket", "another unit type"),
    ("other@.service", "a template alias of a plain unit"), ("other@i.service", "an instance alias of a plain unit"),
    ('"b14-quoted.service"', "quotes (config_parse_strv unquotes)"), ("dir/b14.service", "a slash"),
    ("multi-user.target.wants/b14.service", "legacy .wants path"), ("%z.service", "unknown specifier"),
    ("b14.service", "the unit itself"), ("b14!.service", "an invalid character"), ("x" * 252 + ".service", "256+ chars"),
]):
    layout(f"alias-invalid-{i:02d}", [f(f"{ETC}/b14.service", svc(f"Alias={word}\n"))], ["b14.service"],
           note=f"Alias= word: {why}")
layout("alias-invalid-with-wantedby", [f(f"{ETC}/b14.service", svc("WantedBy=multi-user.target\nAlias=other\n"))],
       ["b14.service"])
layout("alias-valid-plus-invalid-enabled", [
    f(f"{ETC}/b14.service", svc("Alias=b14-good.service other.bogus\n")),
    ln(f"{ETC}/b14-good.service", "/etc/systemd/system/b14.service"),
], ["b14.service", "b14-good.service"])

# 2c. Invalid WantedBy=/RequiredBy= words and DefaultInstance= values.
for i, (line, why) in enumerate([
    ("WantedBy=multi-user", "no suffix"), ("WantedBy=%z.target", "unknown specifier"),
    ("RequiredBy=foo.bogus", "unknown type"), ('WantedBy="multi-user.target"', "quoted"),
    ("WantedBy=multi-user.target \\\n  default.target", "continued over two lines"),
    ("WantedBy=multi-user.target\nWantedBy=", "an empty value resets the list"),
    ("RequiredBy=multi-user.target\nRequiredBy=", "an empty value resets the list"),
    ("WantedBy = multi-user.target", "spaces around ="),
    ("wantedby=multi-user.target", "key in lower case"),
    ("X-WantedBy=multi-user.target", "an X- key"),
    ("WantedBy", "no '='"), ("=multi-user.target", "no key"),
]):
    layout(f"rules-{i:02d}", [f(f"{ETC}/c14.service", svc(line + "\n"))], ["c14.service"], note=why)
for i, (line, why) in enumerate([
    ("DefaultInstance=a/b", "a slash"), ("DefaultInstance=%z", "unknown specifier"),
    ("DefaultInstance=", "empty"), ("DefaultInstance=with@at", "an @ inside (allowed)"),
    ("DefaultInstance=\u00e9", "non-ASCII"),
]):
    layout(f"default-instance-{i:02d}", [f(f"{ETC}/d14@.service", svc("WantedBy=multi-user.target\n" + line + "\n"))],
           ["d14@x.service"], note=why)
layout("default-instance-on-plain-unit", [f(f"{ETC}/d14.service", svc("DefaultInstance=x\n"))], ["d14.service"],
       note="DefaultInstance= on a non-template is a warning")
layout("default-instance-invalid-on-plain-unit", [f(f"{ETC}/d14.service", svc("DefaultInstance=a/b\n"))],
       ["d14.service"])
layout("default-instance-enabled-link", [
    f(f"{ETC}/d14@.service", svc("WantedBy=multi-user.target\nDefaultInstance=def\n")),
    ln(f"{ETC}/multi-user.target.wants/d14@def.service", "/etc/systemd/system/d14@.service"),
], ["d14@def.service", "d14@other.service"])

# 2d. Alias= on unit types that may not have aliases (unit_type_may_alias), and on those that may.
BODIES = {
    "mount": "[Mount]\nWhat=tmpfs\nWhere=/srv/m14\nType=tmpfs\n",
    "automount": "[Automount]\nWhere=/srv/m14\n",
    "swap": "[Swap]\nWhat=/srv/swap14\n",
    "slice": "[Slice]\n",
    "scope": "[Scope]\n",
    "socket": "[Socket]\nListenStream=/run/e14.sock\n",
    "timer": "[Timer]\nOnActiveSec=1h\n",
    "path": "[Path]\nPathExists=/srv/e14\n",
    "target": "[Unit]\nDescription=t\n",
}
NAME = {"mount": "srv-m14", "automount": "srv-m14", "swap": "srv-swap14"}
for typ, body in BODIES.items():
    u = f"{NAME.get(typ, 'e14')}.{typ}"
    layout(f"alias-on-{typ}", [f(f"{ETC}/{u}", body + f"\n[Install]\nAlias=e14-alias.{typ}\n")], [u])
    layout(f"alias-and-wantedby-on-{typ}", [
        f(f"{ETC}/{u}", body + f"\n[Install]\nWantedBy=multi-user.target\nAlias=e14-alias.{typ}\n")], [u])
for typ in ("mount", "slice", "swap"):
    u = f"{NAME.get(typ, 'e14')}.{typ}"
    layout(f"alias-link-by-hand-on-{typ}", [
        f(f"{ETC}/{u}", BODIES[typ] + f"\n[Install]\nAlias=e14-alias.{typ}\n"),
        ln(f"{ETC}/e14-alias.{typ}", f"/etc/systemd/system/{u}"),
    ], [u, f"e14-alias.{typ}"])

# 2e. Lines that are not valid UTF-8 (parse_line: utf8_is_valid) and section headers.
BAD_UTF8 = [
    (b"\xff", "0xff"), (b"\xc3", "truncated sequence"), (b"\xc0\xaf", "overlong"),
    (b"\xed\xa0\x80", "UTF-16 surrogate"), (b"\x80", "lone continuation byte"), (b"\xf4\x90\x80\x80", "above U+10FFFF"),
]
for i, (bad, why) in enumerate(BAD_UTF8):
    layout(f"utf8-install-value-{i}", [f(f"{ETC}/f14.service", SVC_B + b"\n[Install]\nWantedBy=multi-user.target" + bad + b"\n")],
           ["f14.service"], note=why)
# Valid UTF-8 to Python, refused by systemd's unichar_is_valid (noncharacters, U+xFFFE/U+xFFFF).
for i, (ch, why) in enumerate([("\ufffe", "U+FFFE"), ("\uffff", "U+FFFF"), ("\ufdd0", "U+FDD0"), ("\ufdef", "U+FDEF"),
                                ("\U0001fffe", "U+1FFFE"), ("\U0010ffff", "U+10FFFF"), ("\ufeff", "U+FEFF inside a value"),
                                ("\ufffd", "U+FFFD (valid)")]):
    layout(f"utf8-nonchar-{i}", [f(f"{ETC}/f14.service", svc("WantedBy=multi-user.target\n", SVC.replace("differential", "x" + ch)))],
           ["f14.service"], note=f"{why} in Description=; Python's UTF-8 codec accepts it")
layout("utf8-service-value", [f(f"{ETC}/f14.service", b"[Service]\nType=oneshot\nExecStart=/bin/echo \xff\n\n[Install]\nWantedBy=multi-user.target\n")],
       ["f14.service"], note="invalid UTF-8 outside [Install]")
layout("utf8-comment", [f(f"{ETC}/f14.service", SVC_B + b"\n[Install]\n# caf\xe9\nWantedBy=multi-user.target\n")],
       ["f14.service"], note="comments are skipped before the UTF-8 check")
layout("utf8-indented-comment", [f(f"{ETC}/f14.service", SVC_B + b"\n[Install]\n \t; caf\xe9\nWantedBy=multi-user.target\n")],
       ["f14.service"])
layout("utf8-unknown-section", [f(f"{ETC}/f14.service", SVC_B + b"\n[X-Vendor]\nKey=\xff\n\n[Install]\nWantedBy=multi-user.target\n")],
       ["f14.service"], note="an ignored section is still checked")
layout("utf8-valid-multibyte", [f(f"{ETC}/f14.service", svc("WantedBy=multi-user.target\n", SVC.replace("differential", "caf\u00e9 \u2603")))],
       ["f14.service"], note="valid UTF-8: control")
layout("utf8-static-unit", [f(f"{ETC}/f14.service", SVC_B.replace(b"differential", b"\xff"))], ["f14.service"],
       note="no [Install] at all, invalid UTF-8 in Description=")
layout("utf8-continuation-line", [f(f"{ETC}/f14.service", SVC_B + b"\n[Install]\nWantedBy=multi-user.target \\\n\xff\n")],
       ["f14.service"])
layout("utf8-after-install-in-other-section", [f(f"{ETC}/f14.service", b"[Install]\nWantedBy=multi-user.target\n\n" + SVC_B.replace(b"/bin/true", b"/bin/true \xfe"))],
       ["f14.service"])

HEADERS = [
    ("[Install", "no closing bracket"), ('[Inst"all]', "a quote"), ("[Inst'all]", "a single quote"),
    ("[Inst\\all]", "a backslash"), ("[Inst\x01all]", "a control character"), ("[Inst\tall]", "a tab inside"),
    ("[Inst\x7fall]", "DEL"), ("[Install]x", "text after the bracket"), ("[Install] ]", "two brackets"),
    ("[ Install ]", "spaces inside (safe, but another name)"), ("[install]", "lower case"), ("[]", "empty name"),
    ("[Install]]", "doubled bracket"), ("[[Install]", "opening bracket doubled"), ("[X-Foo\x1f]", "control char in X- section"),
    ("[Service\x02]", "control char in another section"), ("[Inst\u00e4ll]", "non-ASCII letter (safe)"),
]
for i, (hdr, why) in enumerate(HEADERS):
    layout(f"section-header-{i:02d}", [f(f"{ETC}/g14.service", SVC + "\n" + hdr + "\nWantedBy=multi-user.target\n")],
           ["g14.service"], note=why)
layout("section-header-before-any", [f(f"{ETC}/g14.service", "WantedBy=multi-user.target\n" + SVC)], ["g14.service"],
       note="an assignment before any section")
layout("section-install-twice", [f(f"{ETC}/g14.service", svc("WantedBy=multi-user.target\n") + "\n[Service]\n\n[Install]\nAlias=g14-alias.service\n")],
       ["g14.service"])

# 2f. Paths in a unit directory that have the unit's name but are not regular files.
layout("dir-named-unit-in-etc", [d(f"{ETC}/h14.service")], ["h14.service"])
layout("dir-named-unit-over-vendor", [d(f"{ETC}/h14.service"), f(f"{USR}/h14.service", svc("WantedBy=multi-user.target\n"))],
       ["h14.service"], note="a directory in /etc, the real unit file in /usr/lib")
layout("dir-named-unit-in-run-over-vendor", [d(f"{RUN}/h14.service"), f(f"{USR}/h14.service", svc("WantedBy=multi-user.target\n"))],
       ["h14.service"])
layout("dir-named-unit-below-etc", [f(f"{ETC}/h14.service", svc("WantedBy=multi-user.target\n")), d(f"{USR}/h14.service")],
       ["h14.service"], note="the directory is in a lower-priority directory")
layout("symlink-to-dir-named-unit", [d(f"{SRV}/h14.service"), ln(f"{ETC}/h14.service", "/srv/linked/h14.service")],
       ["h14.service"])
layout("dropin-conf-is-a-directory", [f(f"{ETC}/h14.service", svc("WantedBy=multi-user.target\n")), d(f"{ETC}/h14.service.d/x.conf")],
       ["h14.service"])
layout("dropin-conf-dangling-link", [f(f"{ETC}/h14.service", svc("WantedBy=multi-user.target\n")),
                                     ln(f"{ETC}/h14.service.d/x.conf", "/srv/linked/missing.conf")], ["h14.service"])
layout("dangling-alias-link", [ln(f"{ETC}/h14.service", "/etc/systemd/system/h14-missing.service")], ["h14.service"])
layout("dangling-link-relative", [ln(f"{ETC}/h14.service", "h14-missing.service")], ["h14.service"])
layout("self-link", [ln(f"{ETC}/h14.service", "h14.service")], ["h14.service"])
layout("link-loop", [ln(f"{ETC}/h14.service", "h14-b.service"), ln(f"{ETC}/h14-b.service", "h14.service")],
       ["h14.service", "h14-b.service"])

# 2g. How lines end and what counts as whitespace (read_line_full, strstrip with WHITESPACE).
def b(s: str) -> bytes:
    return s.encode("utf-8")


EOL_CASES = [
    ("crlf", "\r\n"), ("cr", "\r"), ("lfcr", "\n\r"), ("crcr", "\r\r"), ("nul", "\0"), ("lfnul", "\n\0"),
    ("vt", "\v"), ("ff", "\f"), ("fs", "\x1c"), ("gs", "\x1d"), ("rs", "\x1e"), ("nel", "\u0085"),
    ("ls", "\u2028"), ("ps", "\u2029"),
]
for name, eol in EOL_CASES:
    text = ("[Unit]" + eol + "Description=eol" + eol + "[Service]" + eol + "Type=oneshot" + eol
            + "ExecStart=/bin/true" + eol + "[Install]" + eol + "WantedBy=multi-user.target" + eol)
    layout(f"eol-all-{name}", [f(f"{ETC}/i14.service", text)], ["i14.service"], note=f"every line ends in {eol!r}")
    # Only the break between [Install] and the rule is odd: systemd may see one line there.
    layout(f"eol-install-{name}", [f(f"{ETC}/i14.service", SVC + "\n[Install]" + eol + "WantedBy=multi-user.target\n")],
           ["i14.service"], note=f"[Install]{eol!r}WantedBy=")
    layout(f"eol-between-rules-{name}", [f(f"{ETC}/i14.service", SVC + "\n[Install]\nWantedBy=multi-user.target" + eol + "Alias=i14-alias.service\n")],
           ["i14.service", "i14-alias.service"], note=f"two assignments separated by {eol!r}")
layout("eol-raw-0x85", [f(f"{ETC}/i14.service", SVC_B + b"\n[Install]\x85WantedBy=multi-user.target\n")], ["i14.service"],
       note="a raw 0x85 byte (invalid UTF-8), not U+0085")
layout("eol-none-at-end", [f(f"{ETC}/i14.service", SVC + "\n[Install]\nWantedBy=multi-user.target")], ["i14.service"],
       note="no newline at end of file")
layout("eol-nul-inside-value", [f(f"{ETC}/i14.service", SVC + "\n[Install]\nWantedBy=multi-user.target\0trailing\n")],
       ["i14.service"], note="NUL ends the line: 'trailing' is a line of its own")

SPACES = [
    ("nbsp", "\u00a0"), ("en-space", "\u2002"), ("ideographic", "\u3000"), ("vt", "\v"), ("ff", "\f"),
    ("nel", "\u0085"), ("fs", "\x1c"), ("tab", "\t"), ("cr", "\r"), ("zwsp", "\u200b"),
]
for name, sp in SPACES:
    layout(f"space-around-value-{name}", [f(f"{ETC}/j14.service", SVC + "\n[Install]\nWantedBy=" + sp + "multi-user.target" + sp + "\n")],
           ["j14.service"], note=f"{sp!r} around the value")
    layout(f"space-between-words-{name}", [f(f"{ETC}/j14.service", SVC + "\n[Install]\nAlias=j14-a.service" + sp + "j14-b.service\n")],
           ["j14.service"], note=f"{sp!r} between two Alias= words")
    layout(f"space-around-key-{name}", [f(f"{ETC}/j14.service", SVC + "\n[Install]\n" + sp + "WantedBy" + sp + "=multi-user.target\n")],
           ["j14.service"], note=f"{sp!r} around the key")
    layout(f"space-around-header-{name}", [f(f"{ETC}/j14.service", SVC + "\n" + sp + "[Install]" + sp + "\nWantedBy=multi-user.target\n")],
           ["j14.service"], note=f"{sp!r} around [Install]")
layout("space-only-file", [f(f"{ETC}/j14.service", " \n")], ["j14.service"], note="not empty, so not a mask")
layout("comment-only-file", [f(f"{ETC}/j14.service", "# nothing\n")], ["j14.service"])
layout("empty-file", [f(f"{ETC}/j14.service", "")], ["j14.service"], note="an empty unit file is a mask")
layout("empty-file-in-run", [f(f"{RUN}/j14.service", ""), f(f"{USR}/j14.service", svc("WantedBy=multi-user.target\n"))],
       ["j14.service"])
layout("continuation-in-install", [f(f"{ETC}/j14.service", SVC + "\n[Install]\nWantedBy=multi-user.target \\\n default.target\n")],
       ["j14.service"])
layout("continuation-comment-inside", [f(f"{ETC}/j14.service", SVC + "\n[Install]\nWantedBy=multi-user.target \\\n# comment\n default.target\n")],
       ["j14.service"], note="a comment line inside a continued value")
layout("continuation-swallows-header", [f(f"{ETC}/j14.service", SVC.replace("/bin/true", "/bin/true \\") + "\n[Install]\nWantedBy=multi-user.target\n")],
       ["j14.service"], note="a continued ExecStart= followed by a blank line and [Install]")
layout("continuation-into-header", [f(f"{ETC}/j14.service", SVC.replace("/bin/true", "/bin/true \\") + "[Install]\nWantedBy=multi-user.target\n")],
       ["j14.service"], note="the continued line swallows [Install]")
layout("continuation-at-eof", [f(f"{ETC}/j14.service", SVC + "\n[Install]\nWantedBy=multi-user.target \\")], ["j14.service"])
layout("escaped-backslash-at-eol", [f(f"{ETC}/j14.service", SVC + "\n[Install]\nWantedBy=multi-user.target\\\\\n")], ["j14.service"])

# 2h. A UTF-8 byte order mark (config_parse: stripped once, at the start of a line, after the
#     comment check).
BOM = "\ufeff"
layout("bom-at-start", [f(f"{ETC}/k14.service", BOM + svc("WantedBy=multi-user.target\n"))], ["k14.service"])
layout("bom-before-install", [f(f"{ETC}/k14.service", BOM + "[Install]\nWantedBy=multi-user.target\n" + SVC)], ["k14.service"])
layout("bom-twice", [f(f"{ETC}/k14.service", BOM + BOM + "[Install]\nWantedBy=multi-user.target\n")], ["k14.service"])
layout("bom-on-later-line", [f(f"{ETC}/k14.service", SVC + "\n" + BOM + "[Install]\nWantedBy=multi-user.target\n")], ["k14.service"])
layout("bom-on-two-lines", [f(f"{ETC}/k14.service", BOM + SVC + "\n" + BOM + "[Install]\nWantedBy=multi-user.target\n")], ["k14.service"])
layout("bom-before-comment", [f(f"{ETC}/k14.service", BOM + "#comment\n[Install]\nWantedBy=multi-user.target\n")], ["k14.service"])
layout("bom-in-dropin", [f(f"{ETC}/k14.service", SVC), f(f"{ETC}/k14.service.d/i.conf", BOM + "[Install]\nWantedBy=multi-user.target\n")],
       ["k14.service"])

# 2i. Names starting with a dot, backup suffixes (hidden_or_backup_file) in unit directories.
UNIT_L = svc("WantedBy=multi-user.target\n")
layout("dot-unit-file", [f(f"{ETC}/.l14.service", UNIT_L)], [".l14.service"], note="'.l14.service' is a valid unit name")
layout("dot-wants-link", [f(f"{ETC}/l14.service", UNIT_L), ln(f"{ETC}/multi-user.target.wants/.l14.service", "/etc/systemd/system/l14.service")],
       ["l14.service"])
layout("dot-unit-enabled", [f(f"{ETC}/.l14.service", UNIT_L), ln(f"{ETC}/multi-user.target.wants/.l14.service", "/etc/systemd/system/.l14.service")],
       [".l14.service"])
layout("dot-wants-dir", [f(f"{ETC}/l14.service", UNIT_L), ln(f"{ETC}/.multi-user.target.wants/l14.service", "/etc/systemd/system/l14.service")],
       ["l14.service"])
layout("dot-alias-link", [f(f"{ETC}/l14.service", svc("Alias=.l14-alias.service\n")), ln(f"{ETC}/.l14-alias.service", "/etc/systemd/system/l14.service")],
       ["l14.service", ".l14-alias.service"])
layout("dot-dropin", [f(f"{ETC}/l14.service", SVC), f(f"{ETC}/l14.service.d/.x.conf", "[Install]\nWantedBy=multi-user.target\n")],
       ["l14.service"])
layout("backup-suffix-wants-link", [f(f"{ETC}/l14.service", UNIT_L), ln(f"{ETC}/multi-user.target.wants/l14.service~", "/etc/systemd/system/l14.service")],
       ["l14.service"])
layout("dpkg-old-unit", [f(f"{ETC}/l14.service.dpkg-old", UNIT_L), f(f"{ETC}/l14.service", SVC)], ["l14.service"])
layout("backup-dropin", [f(f"{ETC}/l14.service", SVC), f(f"{ETC}/l14.service.d/x.conf~", "[Install]\nWantedBy=multi-user.target\n")],
       ["l14.service"])
layout("dropin-wrong-suffix", [f(f"{ETC}/l14.service", SVC), f(f"{ETC}/l14.service.d/x.cfg", "[Install]\nWantedBy=multi-user.target\n")],
       ["l14.service"])

# 2j. Unit types without unit files of their own; units that do not exist.
layout("scope-file", [f(f"{ETC}/m14.scope", "[Scope]\n\n[Install]\nWantedBy=multi-user.target\n")], ["m14.scope"])
layout("scope-file-enabled", [f(f"{ETC}/m14.scope", "[Scope]\n\n[Install]\nWantedBy=multi-user.target\n"),
                              ln(f"{ETC}/multi-user.target.wants/m14.scope", "/etc/systemd/system/m14.scope")], ["m14.scope"])
layout("scope-init", [d(ETC)], ["init.scope", "-.slice"], note="units the manager makes without unit files")
layout("device-unit", [f(f"{ETC}/dev-m14.device", "[Unit]\nDescription=x\n\n[Install]\nWantedBy=multi-user.target\n")],
       ["dev-m14.device"])
layout("template-scope", [f(f"{ETC}/m14@.scope", "[Install]\nWantedBy=multi-user.target\n")], ["m14@x.scope"],
       note="scopes cannot be templated")
layout("template-mount", [f(f"{ETC}/m14@.mount", "[Install]\nWantedBy=multi-user.target\n")], ["m14@x.mount"])
layout("not-found", [d(ETC)], ["n14-nowhere.service", "n14-nowhere.socket"])
layout("long-name", [f(f"{ETC}/{'n' * 247}.service", UNIT_L)], [f"{'n' * 247}.service"], note="255 characters: the longest valid name")

# 2k. Templates, instances, DefaultInstance=.
TPL = svc("WantedBy=multi-user.target\n")
layout("instance-of-template-no-links", [f(f"{ETC}/o14@.service", TPL)], ["o14@a.service"])
layout("instance-enabled", [f(f"{ETC}/o14@.service", TPL), ln(f"{ETC}/multi-user.target.wants/o14@a.service", "/etc/systemd/system/o14@.service")],
       ["o14@a.service", "o14@b.service"])
layout("instance-static-template", [f(f"{ETC}/o14@.service", SVC)], ["o14@a.service"])
layout("instance-own-file", [f(f"{ETC}/o14@.service", TPL), f(f"{ETC}/o14@a.service", SVC)], ["o14@a.service", "o14@b.service"],
       note="an instance with a unit file of its own")
layout("instance-link-in-vendor-wants", [f(f"{USR}/o14@.service", TPL), ln(f"{USR}/multi-user.target.wants/o14@a.service", "../o14@.service")],
       ["o14@a.service", "o14@b.service"])
layout("instance-link-in-run-wants", [f(f"{USR}/o14@.service", TPL), ln(f"{RUN}/multi-user.target.wants/o14@a.service", "/usr/lib/systemd/system/o14@.service")],
       ["o14@a.service"])
layout("instance-alias-to-template", [f(f"{ETC}/o14@.service", TPL), ln(f"{ETC}/o14-other@.service", "o14@.service")],
       ["o14-other@a.service", "o14@a.service"])
layout("instance-alias-specific", [f(f"{ETC}/o14@.service", TPL), ln(f"{ETC}/o14-alias@a.service", "o14@a.service")],
       ["o14-alias@a.service", "o14@a.service"])
layout("instance-alias-instance-mismatch", [f(f"{ETC}/o14@.service", TPL), ln(f"{ETC}/o14-alias@a.service", "o14@b.service")],
       ["o14-alias@a.service"])
layout("instance-masked", [f(f"{ETC}/o14@.service", TPL), ln(f"{ETC}/o14@a.service", "/dev/null")], ["o14@a.service", "o14@b.service"])
layout("template-masked", [ln(f"{ETC}/o14@.service", "/dev/null"), f(f"{USR}/o14@.service", TPL)], ["o14@a.service"])
layout("instance-wants-link-to-other-template", [f(f"{ETC}/o14@.service", TPL), f(f"{ETC}/o14b@.service", TPL),
                                                  ln(f"{ETC}/multi-user.target.wants/o14@a.service", "/etc/systemd/system/o14b@.service")],
       ["o14@a.service"])
layout("instance-template-alias-install", [f(f"{ETC}/o14@.service", svc("Alias=o14-al@.service\n")),
                                           ln(f"{ETC}/o14-al@.service", "/etc/systemd/system/o14@.service")],
       ["o14@a.service", "o14-al@a.service"])
layout("instance-default-instance-and-wantedby-template-target", [
    f(f"{ETC}/o14@.service", svc("WantedBy=o14-t@.target\nDefaultInstance=d\n")),
    ln(f"{ETC}/o14-t@.target.wants/o14@.service", "/etc/systemd/system/o14@.service"),
], ["o14@d.service", "o14@x.service"])

# 2l. Also= chains.
def also(name: str, rules: str) -> dict:
    return f(f"{ETC}/{name}", svc(rules))


layout("also-chain", [also("p14a.service", "Also=p14b.service\n"), also("p14b.service", "Also=p14c.service\n"),
                      also("p14c.service", "WantedBy=multi-user.target\n")], ["p14a.service", "p14b.service", "p14c.service"])
layout("also-chain-enabled-end", [also("p14a.service", "Also=p14b.service\n"), also("p14b.service", "Also=p14c.service\n"),
                                  also("p14c.service", "WantedBy=multi-user.target\n"),
                                  ln(f"{ETC}/multi-user.target.wants/p14c.service", "/etc/systemd/system/p14c.service")],
       ["p14a.service", "p14b.service", "p14c.service"])
layout("also-cycle", [also("p14a.service", "Also=p14b.service\n"), also("p14b.service", "Also=p14a.service\n")],
       ["p14a.service", "p14b.service"])
layout("also-self", [also("p14a.service", "Also=p14a.service\n")], ["p14a.service"])
layout("also-missing", [also("p14a.service", "Also=p14-missing.service\n")], ["p14a.service"])
layout("also-masked", [also("p14a.service", "Also=p14b.service\n"), ln(f"{ETC}/p14b.service", "/dev/null")], ["p14a.service", "p14b.service"])
layout("also-target-invalid-file", [also("p14a.service", "Also=p14b.service\n"),
                                    f(f"{ETC}/p14b.service", SVC + "\n[Install\nWantedBy=multi-user.target\n")],
       ["p14a.service", "p14b.service"], note="the Also= unit's own file is bad")

# 2m. Aliases and alias links made by hand.
AL = svc("WantedBy=multi-user.target\n")
layout("alias-link-etc-to-vendor", [f(f"{USR}/q14.service", AL), ln(f"{ETC}/q14-alias.service", "/usr/lib/systemd/system/q14.service")],
       ["q14.service", "q14-alias.service"])
layout("alias-link-relative", [f(f"{ETC}/q14.service", AL), ln(f"{ETC}/q14-alias.service", "q14.service")], ["q14.service", "q14-alias.service"])
layout("alias-link-in-vendor", [f(f"{USR}/q14.service", AL), ln(f"{USR}/q14-alias.service", "q14.service")], ["q14.service", "q14-alias.service"])
layout("alias-link-in-run", [f(f"{USR}/q14.service", AL), ln(f"{RUN}/q14-alias.service", "/usr/lib/systemd/system/q14.service")],
       ["q14.service", "q14-alias.service"])
layout("alias-chain", [f(f"{ETC}/q14.service", AL), ln(f"{ETC}/q14-b.service", "q14.service"), ln(f"{ETC}/q14-c.service", "q14-b.service")],
       ["q14.service", "q14-b.service", "q14-c.service"])
layout("alias-other-type", [f(f"{ETC}/q14.service", AL), ln(f"{ETC}/q14.socket", "q14.service")], ["q14.socket", "q14.service"])
layout("alias-plain-to-template", [f(f"{ETC}/q14@.service", AL), ln(f"{ETC}/q14.service", "q14@.service")], ["q14.service"])
layout("alias-declared-and-linked", [f(f"{ETC}/q14.service", svc("Alias=q14-alias.service\n")), ln(f"{ETC}/q14-alias.service", "q14.service")],
       ["q14.service", "q14-alias.service"])
layout("alias-declared-linked-in-run", [f(f"{USR}/q14.service", svc("Alias=q14-alias.service\n")),
                                        ln(f"{RUN}/q14-alias.service", "/usr/lib/systemd/system/q14.service")], ["q14.service", "q14-alias.service"])
layout("alias-undeclared-link-in-wants", [f(f"{ETC}/q14.service", AL), ln(f"{ETC}/multi-user.target.wants/q14-other.service", "/etc/systemd/system/q14.service")],
       ["q14.service"], note="a .wants link with another name pointing to the unit")
layout("alias-to-masked", [ln(f"{ETC}/q14.service", "/dev/null"), ln(f"{ETC}/q14-alias.service", "q14.service")], ["q14-alias.service"])
layout("alias-same-name-etc-to-vendor", [f(f"{USR}/q14.service", AL), ln(f"{ETC}/q14.service", "/usr/lib/systemd/system/q14.service")],
       ["q14.service"], note="a link in /etc with the unit's own name pointing to the vendor file")
layout("alias-same-name-etc-to-local", [f(f"{LOCAL}/q14.service", AL), ln(f"{ETC}/q14.service", "/usr/local/lib/systemd/system/q14.service")],
       ["q14.service"])
layout("alias-same-name-relative-dotdot", [f(f"{USR}/q14.service", AL), ln(f"{ETC}/q14.service", "../../../usr/lib/systemd/system/q14.service")],
       ["q14.service"])
layout("alias-mount-by-hand", [f(f"{ETC}/srv-m14.mount", BODIES["mount"]), ln(f"{ETC}/srv-m14b.mount", "srv-m14.mount")],
       ["srv-m14b.mount", "srv-m14.mount"], note="mounts may not have aliases")
layout("alias-link-to-empty-file", [f(f"{ETC}/q14.service", ""), ln(f"{ETC}/q14-alias.service", "q14.service")], ["q14-alias.service", "q14.service"])

# 2n. Linked unit files (links out of the search path).
layout("linked-etc", [f(f"{SRV}/r14.service", AL), ln(f"{ETC}/r14.service", "/srv/linked/r14.service")], ["r14.service"])
layout("linked-run", [f(f"{SRV}/r14.service", AL), ln(f"{RUN}/r14.service", "/srv/linked/r14.service")], ["r14.service"])
layout("linked-and-enabled", [f(f"{SRV}/r14.service", AL), ln(f"{ETC}/r14.service", "/srv/linked/r14.service"),
                              ln(f"{ETC}/multi-user.target.wants/r14.service", "/srv/linked/r14.service")], ["r14.service"])
layout("linked-enabled-runtime", [f(f"{SRV}/r14.service", AL), ln(f"{ETC}/r14.service", "/srv/linked/r14.service"),
                                  ln(f"{RUN}/multi-user.target.wants/r14.service", "/srv/linked/r14.service")], ["r14.service"])
layout("linked-static", [f(f"{SRV}/r14.service", SVC), ln(f"{ETC}/r14.service", "/srv/linked/r14.service")], ["r14.service"])
layout("linked-other-name", [f(f"{SRV}/r14-file.service", AL), ln(f"{ETC}/r14.service", "/srv/linked/r14-file.service")], ["r14.service"])
layout("linked-dangling", [ln(f"{ETC}/r14.service", "/srv/linked/r14-missing.service")], ["r14.service"])
layout("linked-empty-file", [f(f"{SRV}/r14.service", ""), ln(f"{ETC}/r14.service", "/srv/linked/r14.service")], ["r14.service"])
layout("linked-in-vendor-dir", [f(f"{SRV}/r14.service", AL), ln(f"{USR}/r14.service", "/srv/linked/r14.service")], ["r14.service"])
layout("linked-via-subdir-of-etc", [f(f"{ETC}/sub/r14.service", AL), ln(f"{ETC}/r14.service", "sub/r14.service")], ["r14.service"],
       note="a link into a subdirectory of a search-path directory")
layout("linked-invalid-utf8-target", [f(f"{SRV}/r14.service", SVC_B + b"\n[Install]\nWantedBy=multi-user.target\xff\n"),
                                      ln(f"{ETC}/r14.service", "/srv/linked/r14.service")], ["r14.service"])

# 2o. Masks, masked-runtime.
VEN = svc("WantedBy=multi-user.target\n")
layout("masked-runtime", [f(f"{USR}/s14.service", VEN), ln(f"{RUN}/s14.service", "/dev/null")], ["s14.service"])
layout("masked-etc-and-run", [f(f"{USR}/s14.service", VEN), ln(f"{ETC}/s14.service", "/dev/null"), ln(f"{RUN}/s14.service", "/dev/null")], ["s14.service"])
layout("masked-run-over-etc-file", [f(f"{ETC}/s14.service", VEN), ln(f"{RUN}/s14.service", "/dev/null")], ["s14.service"],
       note="/etc comes before /run in the search path")
layout("masked-vendor", [ln(f"{USR}/s14.service", "/dev/null")], ["s14.service"])
layout("masked-local", [ln(f"{LOCAL}/s14.service", "/dev/null"), f(f"{USR}/s14.service", VEN)], ["s14.service"])
layout("masked-runtime-enabled", [f(f"{USR}/s14.service", VEN), ln(f"{RUN}/s14.service", "/dev/null"),
                                  ln(f"{ETC}/multi-user.target.wants/s14.service", "/usr/lib/systemd/system/s14.service")], ["s14.service"])
layout("masked-by-relative-dev-null", [f(f"{USR}/s14.service", VEN), ln(f"{ETC}/s14.service", "../../../dev/null")], ["s14.service"])
layout("masked-without-unit", [ln(f"{ETC}/s14.service", "/dev/null")], ["s14.service"])

# 2p. Drop-ins carrying [Install].
DROP = "[Install]\nWantedBy=multi-user.target\n"
layout("dropin-install-on-static", [f(f"{ETC}/t14.service", SVC), f(f"{ETC}/t14.service.d/i.conf", DROP)], ["t14.service"])
layout("dropin-install-in-run", [f(f"{USR}/t14.service", SVC), f(f"{RUN}/t14.service.d/i.conf", DROP)], ["t14.service"])
layout("dropin-install-in-vendor", [f(f"{USR}/t14.service", SVC), f(f"{USR}/t14.service.d/i.conf", DROP)], ["t14.service"])
layout("dropin-alias", [f(f"{ETC}/t14.service", SVC), f(f"{ETC}/t14.service.d/i.conf", "[Install]\nAlias=t14-alias.service\n"),
                        ln(f"{ETC}/t14-alias.service", "/etc/systemd/system/t14.service")], ["t14.service", "t14-alias.service"])
layout("dropin-resets-wantedby", [f(f"{ETC}/t14.service", VEN), f(f"{ETC}/t14.service.d/i.conf", "[Install]\nWantedBy=\n")], ["t14.service"])
layout("dropin-invalid-utf8", [f(f"{ETC}/t14.service", VEN), f(f"{ETC}/t14.service.d/i.conf", b"[Unit]\nDescription=\xff\n")], ["t14.service"])
layout("dropin-bad-section-header", [f(f"{ETC}/t14.service", VEN), f(f"{ETC}/t14.service.d/i.conf", "[Install\n")], ["t14.service"])
layout("dropin-for-type", [f(f"{ETC}/t14.service", SVC), f(f"{ETC}/service.d/i.conf", DROP)], ["t14.service"],
       note="a drop-in for every service (service.d)")
layout("dropin-for-prefix", [f(f"{ETC}/t14-x.service", SVC), f(f"{ETC}/t14-.service.d/i.conf", DROP)], ["t14-x.service"],
       note="a prefix drop-in (t14-.service.d)")
layout("dropin-for-template", [f(f"{ETC}/t14@.service", SVC), f(f"{ETC}/t14@.service.d/i.conf", DROP)], ["t14@a.service"])
layout("dropin-for-template-enabled", [f(f"{ETC}/t14@.service", SVC), f(f"{ETC}/t14@.service.d/i.conf", DROP),
                                       ln(f"{ETC}/multi-user.target.wants/t14@a.service", "/etc/systemd/system/t14@.service")], ["t14@a.service"])
layout("dropin-masked-by-dev-null", [f(f"{ETC}/t14.service", SVC), f(f"{USR}/t14.service.d/i.conf", DROP),
                                     ln(f"{ETC}/t14.service.d/i.conf", "/dev/null")], ["t14.service"],
       note="a /dev/null drop-in of the same name in a higher-priority directory")
layout("dropin-overridden-by-name", [f(f"{ETC}/t14.service", SVC), f(f"{USR}/t14.service.d/i.conf", DROP),
                                     f(f"{ETC}/t14.service.d/i.conf", "[Unit]\nDescription=override\n")], ["t14.service"])
layout("dropin-install-for-alias-name", [f(f"{ETC}/t14.service", SVC), ln(f"{ETC}/t14-alias.service", "t14.service"),
                                         f(f"{ETC}/t14-alias.service.d/i.conf", DROP)], ["t14.service", "t14-alias.service"])
layout("dropin-also", [f(f"{ETC}/t14.service", SVC), f(f"{ETC}/t14.service.d/i.conf", "[Install]\nAlso=t14-b.service\n"),
                       also("t14-b.service", "WantedBy=multi-user.target\n")], ["t14.service"])
layout("dropin-symlinked-conf", [f(f"{ETC}/t14.service", SVC), f(f"{SRV}/i.conf", DROP), ln(f"{ETC}/t14.service.d/i.conf", "/srv/linked/i.conf")],
       ["t14.service"])

# 2q. Links in vendor .wants directories.
layout("vendor-wants-link", [f(f"{USR}/u14.service", VEN), ln(f"{USR}/multi-user.target.wants/u14.service", "../u14.service")], ["u14.service"])
layout("vendor-wants-link-static", [f(f"{USR}/u14.service", SVC), ln(f"{USR}/multi-user.target.wants/u14.service", "../u14.service")], ["u14.service"])
layout("vendor-requires-link", [f(f"{USR}/u14.service", VEN), ln(f"{USR}/multi-user.target.requires/u14.service", "../u14.service")], ["u14.service"])
layout("local-wants-link", [f(f"{LOCAL}/u14.service", VEN), ln(f"{LOCAL}/multi-user.target.wants/u14.service", "../u14.service")], ["u14.service"])
layout("run-wants-link", [f(f"{USR}/u14.service", VEN), ln(f"{RUN}/multi-user.target.wants/u14.service", "/usr/lib/systemd/system/u14.service")],
       ["u14.service"])
layout("vendor-and-etc-wants-links", [f(f"{USR}/u14.service", VEN), ln(f"{USR}/multi-user.target.wants/u14.service", "../u14.service"),
                                      ln(f"{ETC}/multi-user.target.wants/u14.service", "/usr/lib/systemd/system/u14.service")], ["u14.service"])
layout("etc-wants-link-to-nothing", [f(f"{USR}/u14.service", SVC), ln(f"{ETC}/multi-user.target.wants/u14.service", "/nonexistent/u14.service")],
       ["u14.service"], note="the link's name counts, not its target")
layout("upholds-dir-link", [f(f"{ETC}/u14.service", VEN), ln(f"{ETC}/multi-user.target.upholds/u14.service", "/etc/systemd/system/u14.service")],
       ["u14.service"])
layout("wants-dir-of-non-unit", [f(f"{ETC}/u14.service", SVC), ln(f"{ETC}/foo.wants/u14.service", "/etc/systemd/system/u14.service")],
       ["u14.service"], note="'foo.wants' is not named after a unit")
layout("wants-dir-is-symlink", [f(f"{ETC}/u14.service", VEN), ln(f"{SRV}/w/u14.service", "/etc/systemd/system/u14.service"),
                                ln(f"{ETC}/multi-user.target.wants", "/srv/linked/w")], ["u14.service"],
       note="the .wants directory itself is a symlink (d_type DT_LNK)")

# 2r. UpheldBy= (not an [Install] key in v252's install.c).
layout("upheldby-only", [f(f"{ETC}/v14.service", svc("UpheldBy=multi-user.target\n"))], ["v14.service"])
layout("upheldby-and-wantedby", [f(f"{ETC}/v14.service", svc("UpheldBy=multi-user.target\nWantedBy=default.target\n"))], ["v14.service"])
layout("upheldby-with-upholds-link", [f(f"{ETC}/v14.service", svc("UpheldBy=multi-user.target\n")),
                                      ln(f"{ETC}/multi-user.target.upholds/v14.service", "/etc/systemd/system/v14.service")], ["v14.service"])
layout("upheldby-invalid-word", [f(f"{ETC}/v14.service", svc("UpheldBy=not-a-unit\n"))], ["v14.service"])

# 2s. The same name in several directories; links between /usr/lib, /usr/local/lib, /etc, /run.
W = svc("WantedBy=multi-user.target\n")
layout("dirs-etc-over-vendor", [f(f"{ETC}/w14.service", SVC), f(f"{USR}/w14.service", W)], ["w14.service"])
layout("dirs-vendor-over-etc-install", [f(f"{ETC}/w14.service", W), f(f"{USR}/w14.service", SVC)], ["w14.service"])
layout("dirs-local-over-vendor", [f(f"{LOCAL}/w14.service", W), f(f"{USR}/w14.service", SVC)], ["w14.service"])
layout("dirs-run-over-local", [f(f"{RUN}/w14.service", SVC), f(f"{LOCAL}/w14.service", W)], ["w14.service"])
layout("dirs-etc-over-run", [f(f"{ETC}/w14.service", W), f(f"{RUN}/w14.service", SVC)], ["w14.service"])
layout("dirs-only-run", [f(f"{RUN}/w14.service", W)], ["w14.service"])
layout("dirs-only-local", [f(f"{LOCAL}/w14.service", W)], ["w14.service"])
layout("dirs-only-vendor", [f(f"{USR}/w14.service", W)], ["w14.service"])
layout("dirs-only-vendor-enabled", [f(f"{USR}/w14.service", W), ln(f"{ETC}/multi-user.target.wants/w14.service", "/usr/lib/systemd/system/w14.service")],
       ["w14.service"])
layout("dirs-only-run-enabled-runtime", [f(f"{RUN}/w14.service", W), ln(f"{RUN}/multi-user.target.wants/w14.service", "/run/systemd/system/w14.service")],
       ["w14.service"])
layout("dirs-run-file-etc-link", [f(f"{RUN}/w14.service", W), ln(f"{ETC}/multi-user.target.wants/w14.service", "/run/systemd/system/w14.service")],
       ["w14.service"])
layout("dirs-local-link-to-vendor-other-name", [f(f"{USR}/w14.service", W), ln(f"{LOCAL}/w14-alias.service", "/usr/lib/systemd/system/w14.service")],
       ["w14.service", "w14-alias.service"])
layout("dirs-run-link-to-etc", [f(f"{ETC}/w14.service", W), ln(f"{RUN}/w14-alias.service", "/etc/systemd/system/w14.service")],
       ["w14.service", "w14-alias.service"])
layout("dirs-etc-link-to-run-same-name", [f(f"{RUN}/w14.service", W), ln(f"{ETC}/w14.service", "/run/systemd/system/w14.service")],
       ["w14.service"])
layout("dirs-vendor-link-to-etc", [f(f"{ETC}/w14-real.service", W), ln(f"{USR}/w14.service", "/etc/systemd/system/w14-real.service")],
       ["w14.service", "w14-real.service"])
layout("dirs-etc-wants-in-run", [f(f"{USR}/w14.service", W), ln(f"{RUN}/multi-user.target.wants/w14.service", "/usr/lib/systemd/system/w14.service"),
                                 ln(f"{ETC}/default.target.wants/w14.service", "/usr/lib/systemd/system/w14.service")], ["w14.service"])
layout("dirs-lib-path-link", [f(f"{USR}/w14.service", W), ln(f"{ETC}/w14-alias.service", "/lib/systemd/system/w14.service")],
       ["w14.service", "w14-alias.service"], note="/lib is a link to /usr/lib on Debian 12 (and in the search path before it)")
layout("dirs-attached", [f("etc/systemd/system.attached/w14.service", W)], ["w14.service"], note="the portable-service attach directory")

# 2t. Odd things in a unit directory beside a good unit.
layout("bak-file-beside-unit", [f(f"{ETC}/x14.service", W), f(f"{ETC}/x14.service.bak", "garbage\n")], ["x14.service"])
layout("many-links-to-one-file", [f(f"{ETC}/x14.service", svc("WantedBy=multi-user.target\nAlias=x14-a.service\n")),
                                  ln(f"{ETC}/x14-b.service", "x14.service"),
                                  ln(f"{ETC}/default.target.wants/x14-c.service", "/etc/systemd/system/x14.service")],
       ["x14.service", "x14-b.service"])
layout("invalid-name-link-in-etc", [f(f"{ETC}/x14.service", W), ln(f"{ETC}/x14 bad.service", "x14.service")], ["x14.service"],
       note="a link whose name is not a valid unit name")


# ----------------------------------------------------------------------------------------------
# YAML output (written by hand so that every byte is exact and visible).
# ----------------------------------------------------------------------------------------------

def _plain_ok(s: str) -> bool:
    return all(c == "\n" or " " <= c <= "~" for c in s)


def _quote(s: str) -> str:
    out = []
    for c in s:
        o = ord(c)
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif " " <= c <= "~":
            out.append(c)
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


def _content(key_indent: str, content: str | bytes) -> list[str]:
    if isinstance(content, bytes):
        try:
            content = content.decode("utf-8")
        except UnicodeDecodeError:
            return [f"{key_indent}content_b64: {base64.b64encode(content).decode()}"]
    if (content and content.endswith("\n") and _plain_ok(content) and not content.startswith((" ", "\n"))
            and not any(line != line.rstrip(" \t") for line in content.split("\n"))
            and "\n\n\n" not in content[-3:] and not content.endswith("\n\n")):
        lines = [f"{key_indent}content: |"]
        lines += [f"{key_indent}  {line}" if line else "" for line in content[:-1].split("\n")]
        return lines
    return [f"{key_indent}content: {_quote(content)}"]


def dump() -> str:
    out = ["# Unit-file layouts for the differential test against systemd (see README.md).",
           "# Generated by make_layouts.py; expected answers are never stored: ask the live systemd.",
           f"# {len(LAYOUTS)} layouts.", "layouts:"]
    for lay in LAYOUTS:
        out.append(f"  - id: {lay['id']}")
        out.append(f"    source: {_quote(lay['source'])}")
        if "note" in lay:
            out.append(f"    note: {_quote(lay['note'])}")
        out.append("    files:" + ("" if lay["files"] else " []"))
        for fe in lay["files"]:
            out.append(f"      - path: {_quote(fe['path'])}")
            if fe.get("dir"):
                out.append("        dir: true")
            elif "symlink" in fe:
                out.append(f"        symlink: {_quote(fe['symlink'])}")
            else:
                out.extend(_content("        ", fe["content"]))
        out.append("    units: [" + ", ".join(_quote(u) for u in lay["units"]) + "]")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dump())
