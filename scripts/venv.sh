#!/usr/bin/env bash
# The virtualenv both README commands start with: `.venv`, made if missing, with this package
# installed editable (`bash scripts/venv.sh` for the package, `bash scripts/venv.sh ".[test]"`
# with the test extras; further arguments go to the installer).
#
# uv installs, not pip: it is taken from PyPI by the machine's own pip, then downloads and
# unpacks the ~120 distributions side by side (the test extras: 12 s from nothing on a 2-core
# machine, where pip took 23 s one after another, plus 8 s to make the venv with its own pip and
# upgrade it). The venv still gets pip, installed by uv: tests and users call `python -m pip`.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# the machine's certificate store, as pip uses (uv's own roots would refuse a registry mirror
# or proxy whose certificate only the machine trusts)
export UV_NATIVE_TLS=${UV_NATIVE_TLS:-1}
target=${1:-.}
shift $(($# > 0 ? 1 : 0))
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv --without-pip .venv
fi
if [ ! -x .venv/bin/uv ]; then
    # pip's --python puts uv in the venv without a pip there first
    "$PYTHON" -m pip --python .venv/bin/python install -q --disable-pip-version-check uv
fi
# uv leaves lock files of its build environments (uv-setuptools-*.lock, three a run) in the
# temporary directory: they go in the venv's own, so a run leaves nothing in /tmp
mkdir -p .venv/tmp
TMPDIR="$PWD/.venv/tmp" .venv/bin/uv pip install -q --python .venv/bin/python pip -e "$target" "$@"
