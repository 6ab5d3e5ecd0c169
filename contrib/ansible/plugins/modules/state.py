#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, reconcile developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: state
short_description: Converge a host to a reconcile state file
version_added: "0.1.0"
description:
  - Runs C(reconcile apply --format json -) on the target with the state on standard input.
    reconcile observes the host, plans the minimal actions, carries them out in order and
    verifies by observing again; its JSON report comes back as RV(report).
  - In check mode runs C(reconcile diff --format json -) instead, which changes nothing, and
    reports C(changed) when actions are planned.
  - In diff mode (C(--diff)) each resource's drift is shown as Ansible's before and after,
    one line per field, before being what the host has and after what the state wants.
  - The state is O(src), a file on the controller templated as M(ansible.builtin.template)
    templates, or O(content).
options:
  src:
    description:
      - A state file on the controller, templated with the task's variables (Jinja2).
      - A relative path is looked up in the role's or the playbook's C(templates/) directory,
        then beside the playbook, as M(ansible.builtin.template) does.
      - Read by the action plugin on the controller; mutually exclusive with O(content).
    type: path
  content:
    description:
      - The state file's text. Mutually exclusive with O(src).
    type: str
  state_label:
    description:
      - The file name reconcile's messages and report give the state (C(--state-label)), so an
        error points into the user's file.
      - Defaults to O(src) when that is given, else C(<stdin>).
    type: str
  journal:
    description:
      - The journal file on the target (C(reconcile apply --journal)); the apply lock sits beside it.
      - Unset, reconcile's default (C(/var/lib/reconcile/journal.jsonl) as root).
      - Not used in check mode, which writes nothing.
    type: path
  lock_timeout:
    description:
      - How long to wait for another apply on the target to finish (C(reconcile apply
        --lock-timeout)), e.g. C(30s) or C(5m); past it the task fails.
    type: str
    default: 0s
  executable:
    description:
      - How to run reconcile on the target, a command line split as a shell splits words
        (no shell runs it), e.g. C(/opt/reconcile/.venv/bin/reconcile) or C(python3 -m reconcile_host).
    type: str
    default: reconcile
  fail_on_blocked:
    description:
      - Fail the task when drift remains after applying (reconcile's exit status 2, for a resource
        blocked, an action that failed, drift not verified), and in check mode when a resource
        is blocked.
      - With V(false) the task succeeds and a later task decides from RV(report), for example
        a health gate that retries while a host converges.
      - Exit status 1 (bad input, lock held, a resource that cannot be observed) always fails.
    type: bool
    default: true
extends_documentation_fragment:
  - action_common_attributes
  - action_common_attributes.flow
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
notes:
  - reconcile must be installed on the target; it is not on PyPI (C(pip install reconcile_host-*.whl), the wheel
    C(pip wheel --no-deps) builds from a checkout, or C(pip install 'reconcile-host @ git+URL')).
  - The state text travels in the module's arguments and is written to no file on the target.
  - Templating may move lines, so positions in error messages refer to the rendered text.
requirements:
  - reconcile on the target (a wheel built from a checkout, or C(pip install 'reconcile-host @ git+URL'))
author:
  - reconcile developers (@reconcile)
"""

EXAMPLES = r"""
- name: Converge a GPU host to its state file (templated on the controller)
  reconcile.host.state:
    src: states/gpu-host.yaml.j2
    journal: /var/lib/reconcile/journal.jsonl
    lock_timeout: 5m

- name: State given inline, reconcile installed in a virtual environment
  reconcile.host.state:
    executable: /opt/reconcile/.venv/bin/reconcile
    content: |
      version: 1
      units:
        vllm-kimi-k25-int4.service:
          active: false
          enabled: false
      gpus:
        count: 8
        max_memory_used: 0MiB

- name: Leave the verdict to a later task (a health gate)
  reconcile.host.state:
    src: states/gpu-host.yaml.j2
    fail_on_blocked: false
  register: converge

- name: Stop here when a resource stays blocked
  ansible.builtin.assert:
    that: converge.report.summary.blocked == 0
    fail_msg: "{{ converge.msg }}"
"""

RETURN = r"""
report:
  description:
    - reconcile's JSON report, C(format_version) 1, with C(command), C(exit_code), C(summary)
      (resources per status; actions planned, done and failed) and C(resources), one entry
      each with C(id), C(kind), C(status), C(drift), C(actions) and C(message).
  returned: when reconcile produced one
  type: dict
  sample:
    format_version: "1"
    command: apply
    exit_code: 0
    summary: {ok: 2, drift: 0, converging: 0, blocked: 0, error: 0, actions_planned: 0, actions_done: 2, actions_failed: 0}
    resources:
      - id: unit:vllm-kimi-k25-int4.service
        kind: unit
        status: ok
        drift: []
        actions:
          - {action: disable, target: vllm-kimi-k25-int4.service, result: done}
          - {action: stop, target: vllm-kimi-k25-int4.service, result: done}
        message: ""
not_ok:
  description: The ids of the resources that are not C(ok), in the order reconcile worked on them.
  returned: when reconcile produced a report
  type: list
  elements: str
  sample: [gpus]
rc:
  description: reconcile's exit status; 0 converged (check mode, no drift), 2 drift remains, 1 an error.
  returned: when reconcile ran
  type: int
  sample: 0
reason:
  description: >-
    Why reconcile refused or could not run, from its error report (C(error.reason)), e.g.
    C(lock-held), C(host-mismatch), C(machine-mismatch), C(journal), C(state-file), C(plan-stale)
    (docs/json-report.md lists the closed set).
  returned: when reconcile printed an error report
  type: str
  sample: lock-held
stderr:
  description: What reconcile wrote on standard error.
  returned: when reconcile ran
  type: str
  sample: ""
cmd:
  description: The command that ran on the target (the state went on its standard input).
  returned: when reconcile ran
  type: list
  elements: str
  sample: [reconcile, apply, --format, json, "-", --state-label, states/gpu-host.yaml.j2, --lock-timeout, 0s]
"""

import json
import shlex

from ansible.module_utils.basic import AnsibleModule

SETTLED = ("ok",)


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def value_text(value):
    return json.dumps(value, sort_keys=True)


def drift_diffs(doc):
    """Ansible's before/after, one pair per resource that drifts, one line per field (have/want)."""
    diffs = []
    for res in doc.get("resources", []):
        drift = res.get("drift") or []
        if not drift:
            continue
        before = "".join("%s: %s\n" % (d["field"], value_text(d.get("have"))) for d in drift)
        after = "".join("%s: %s\n" % (d["field"], value_text(d.get("want"))) for d in drift)
        diffs.append({"before_header": "%s (the host)" % res["id"], "after_header": "%s (the state)" % res["id"],
                      "before": before, "after": after})
    return diffs


def describe(doc, check_mode):
    """One line: what was done or planned, then each resource that is not ok and why."""
    summary = doc.get("summary", {})
    resources = doc.get("resources", [])
    if check_mode:
        head = "%d action(s) planned" % summary.get("actions_planned", 0)
    else:
        head = "%d action(s) done" % summary.get("actions_done", 0)
        if summary.get("actions_failed"):
            head += ", %d failed" % summary["actions_failed"]
    bad = [r for r in resources if r.get("status") not in SETTLED]
    if not bad:
        return "%s; %d resource(s) ok" % (head, len(resources))
    parts = []
    for r in bad:
        why = first_line(r.get("message")).rstrip(";").strip()
        parts.append("%s: %s%s" % (r["id"], r["status"], " (%s)" % why if why else ""))
    return "%s; not ok: %s" % (head, "; ".join(parts))


def run_reconcile(module, argv, content):
    rc, out, err = module.run_command(argv, data=content, binary_data=True, expand_user_and_vars=False)
    try:
        doc = json.loads(out) if out.strip() else None
    except ValueError:
        doc = None
    if doc is not None and not isinstance(doc, dict):
        doc = None
    return rc, doc, err


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path"),
            content=dict(type="str"),
            state_label=dict(type="str"),
            journal=dict(type="path"),
            lock_timeout=dict(type="str", default="0s"),
            executable=dict(type="str", default="reconcile"),
            fail_on_blocked=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("src", "content")],
        required_one_of=[("src", "content")],
        supports_check_mode=True,
    )
    p = module.params
    if p["content"] is None:
        module.fail_json(msg="src is read on the controller by the action plugin reconcile.host.state; "
                             "this module was called without it: give content")
    try:
        command = shlex.split(p["executable"])
    except ValueError as exc:
        module.fail_json(msg="executable %r: %s" % (p["executable"], exc))
    if not command:
        module.fail_json(msg="executable is empty")
    found = module.get_bin_path(command[0]) if "/" not in command[0] else command[0]
    if not found:
        module.fail_json(msg="%s not found on the target: install reconcile there (not on PyPI: "
                             "pip install the wheel `pip wheel --no-deps` builds from a checkout, or "
                             "'reconcile-host @ git+URL'), or set executable" % command[0])
    command[0] = found
    label = p["state_label"] or "<stdin>"

    diff_argv = command + ["diff", "--format", "json", "-", "--state-label", label]
    apply_argv = command + ["apply", "--format", "json", "-", "--state-label", label,
                            "--lock-timeout", p["lock_timeout"]]
    if p["journal"]:
        apply_argv += ["--journal", p["journal"]]

    result = dict(changed=False)
    if module.check_mode:
        argv = diff_argv
        rc, doc, err = run_reconcile(module, diff_argv, p["content"])
        drift_doc = doc
    else:
        drift_doc = None
        if module._diff:
            # The drift as found before acting: the apply report holds what remains after it.
            drift_doc = run_reconcile(module, diff_argv, p["content"])[1]
        argv = apply_argv
        rc, doc, err = run_reconcile(module, apply_argv, p["content"])
    result.update(rc=rc, stderr=err, cmd=argv)

    if doc is None or doc.get("problems") or doc.get("error"):
        # No report, or an error report (a state file that could not be read, a refusal: lock
        # held, another machine): nothing was observed, so the message is reconcile's own line,
        # read from the report (error.message, FILE:LINE:COL: ...) rather than from stderr.
        problems = (doc or {}).get("problems") or []
        error = (doc or {}).get("error") or {}
        why = ((problems[0].get("text") if problems else None) or error.get("message") or first_line(err)
               or "no report on standard output")
        if error.get("reason"):
            result["reason"] = error["reason"]
        if doc is not None:
            result["report"] = doc
        module.fail_json(msg="reconcile %s exited %d: %s" % ("diff" if module.check_mode else "apply", rc, why),
                         **result)

    summary = doc.get("summary", {})
    result["report"] = doc
    result["not_ok"] = [r["id"] for r in doc.get("resources", []) if r.get("status") not in SETTLED]
    result["changed"] = bool(summary.get("actions_planned" if module.check_mode else "actions_done"))
    if module._diff and drift_doc is not None:
        result["diff"] = drift_diffs(drift_doc)
    result["msg"] = describe(doc, module.check_mode)

    if module.check_mode:
        failed = rc == 1 or (p["fail_on_blocked"] and bool(summary.get("blocked")))
    else:
        failed = rc == 1 or (rc == 2 and p["fail_on_blocked"])
    if failed:
        module.fail_json(**result)
    # Said outright: Ansible takes a result with a non-zero rc and no `failed` key as failed.
    module.exit_json(failed=False, **result)


if __name__ == "__main__":
    main()
