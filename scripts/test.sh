#!/usr/bin/env bash
# One command from a fresh clone to a full test run: virtualenv, package with test extras,
# system packages the browser/voice tests need, lint, types, then the whole pytest suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k protocol`).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
bash scripts/system-deps.sh

.venv/bin/ruff check companion tests scripts
.venv/bin/ruff format --check companion tests scripts
.venv/bin/mypy companion
exec .venv/bin/python -m pytest "$@"
