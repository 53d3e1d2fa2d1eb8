#!/usr/bin/env bash
# One command from a fresh clone to a live conversation: virtualenv, the package, then
# `companion demo`: three companions from cards/ as separate processes on 127.0.0.1, talking
# with the offline scripted model until their conversation closes. No API key, no network.
# Extra arguments go to `companion demo` (e.g. `bash scripts/demo.sh --json`, `--pace 1`).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/venv.sh . --compile-bytecode  # three processes start at once: compiled before
exec .venv/bin/companion demo "$@"
