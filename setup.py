"""Only the package list, which pyproject.toml cannot derive for a package rooted at `.`:
every folder with an __init__.py under the layers' folders, as reconcile_host.<dotted path>.
Everything else is declared in pyproject.toml."""

import os

from setuptools import setup

LAYERS = ("pipeline", "reconcilers", "machines", "views", "schema")


def packages() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    found = ["reconcile_host"]
    for layer in LAYERS:
        for folder, dirs, files in os.walk(os.path.join(here, layer)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            if "__init__.py" in files:
                found.append("reconcile_host." + os.path.relpath(folder, here).replace(os.sep, "."))
    return found


setup(packages=packages())
