"""Only what pyproject.toml cannot say for a package rooted at `.`: the package list, worked out
from the layers' folders (every folder with an __init__.py, as reconcile_host.<dotted path>), so
a kind added as a package of its own needs no line anywhere; and this file itself left out of
the installed package. Everything else is declared in pyproject.toml."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS = ("core", "local", "common", "reconcilers", "pipeline", "views", "doors", "schema")


def packages() -> list[str]:
    found = ["reconcile_host"]
    for layer in LAYERS:
        for folder, dirs, files in os.walk(os.path.join(HERE, layer)):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            if "__init__.py" in files:
                found.append("reconcile_host." + os.path.relpath(folder, HERE).replace(os.sep, "."))
    return found


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        return [m for m in super().find_package_modules(package, package_dir)
                if not (package == "reconcile_host" and m[1] == "setup")]


setup(packages=packages(), cmdclass={"build_py": BuildPy})
