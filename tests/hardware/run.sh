#!/bin/sh
# The hardware suite in one command (run as root on a machine with an NVIDIA driver):
#
#   sudo tests/hardware/run.sh            # report in ./hardware-report/ (or in $OUT when set)
#
# It finds a Python that has reconcile's dependencies (PYTHON, .hw-venv, .venv, python3; with a
# venv whose interpreter is not on this machine, python3 of the same version with that venv's
# site-packages), imports reconcile_host from THIS working tree (the repository root is the
# package), and runs tests/hardware/hwsuite.py. Exit 0: everything agreed (or no driver here:
# skipped, and the report says why); 1: something disagreed or broke (the report says what).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-$root/hardware-report}
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
ln -s "$root" "$shim/reconcile_host"
check='import pynvml, click, jsonschema, ruamel.yaml, deepdiff, psutil'
py=""
for c in ${PYTHON:-} "$root/.hw-venv/bin/python" "$root/.venv/bin/python"; do
    if [ -x "$c" ] && "$c" -c "$check" 2>/dev/null; then py=$c; break; fi
done
extra=""
if [ -z "$py" ] && command -v python3 >/dev/null; then
    for sp in "$root"/.hw-venv/lib/python*/site-packages "$root"/.venv/lib/python*/site-packages; do
        [ -d "$sp" ] || continue
        if PYTHONPATH="$sp" python3 -c "$check" 2>/dev/null; then py=python3; extra=$sp; break; fi
    done
    if [ -z "$py" ] && python3 -c "$check" 2>/dev/null; then py=python3; fi
fi
if [ -z "$py" ]; then
    echo "no Python with reconcile's dependencies: make .hw-venv (docs/testing.md#the-hardware-suite)" >&2
    exit 2
fi
PYTHONPATH="$shim${extra:+:$extra}${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$here/hwsuite.py" --out "$out"
