#!/usr/bin/env bash
# One command from a fresh clone to a live conversation: virtualenv, the package, then
# `companion demo`: three companions from cards/ as separate processes on 127.0.0.1, talking
# with the offline scripted model until their conversation closes. No API key, no network.
# Extra arguments go to `companion demo` (e.g. `bash scripts/demo.sh --json`, `--pace 1`).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
exec .venv/bin/companion demo "$@"
