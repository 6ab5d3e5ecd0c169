# -*- coding: utf-8 -*-
# Copyright: (c) 2026, reconcile developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
"""The controller's half of reconcile.host.state: read `src` on the controller, template it
with the task's variables as ansible.builtin.template does, and hand the text to the module
on the target as `content` (labelled with `src`, so reconcile's messages name the user's file)."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

try:  # ansible-core 2.19+: only text marked trusted is templated
    from ansible.template import trust_as_template
except ImportError:  # older ansible-core templates any string
    def trust_as_template(value):
        return value


class ActionModule(ActionBase):

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # unused since ansible-core 2.10
        args = dict(self._task.args)
        src = args.pop("src", None)
        if src is not None:
            if args.get("content") is not None:
                raise AnsibleActionFail("src and content are mutually exclusive")
            args["content"] = self._render(src, task_vars)
            args.setdefault("state_label", src)
        result.update(self._execute_module(module_name="reconcile.host.state", module_args=args,
                                           task_vars=task_vars))
        return result

    def _render(self, src, task_vars):
        try:
            path = self._find_needle("templates", src)
        except AnsibleError as exc:
            raise AnsibleActionFail(to_text(exc))
        try:
            if hasattr(self._loader, "get_text_file_contents"):
                text = self._loader.get_text_file_contents(path)
            else:
                with open(self._loader.get_real_file(path), "rb") as fh:
                    text = to_text(fh.read(), errors="surrogate_or_strict")
        except (AnsibleError, OSError, UnicodeError) as exc:
            raise AnsibleActionFail("cannot read %s: %s" % (src, to_text(exc)))
        templar = self._templar.copy_with_new_env(available_variables=task_vars)
        try:
            rendered = templar.template(trust_as_template(text), escape_backslashes=False)
        except AnsibleError as exc:
            raise AnsibleActionFail("%s: %s" % (src, to_text(exc)))
        return to_text(rendered if rendered is not None else "")
