#!/usr/bin/env bash
# One command from a fresh clone to a full test run: virtualenv, package with test extras,
# system packages the browser/voice tests need, lint, types, then the whole pytest suite.
# Extra arguments go to one plain pytest run instead (e.g. `bash scripts/test.sh -k protocol`).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
began=$SECONDS
took() {  # one line a phase, so that a slow run says where its time went
    echo "test.sh: $1 done at $((SECONDS - began)) s" >&2
}
# The suite starts hundreds of Python processes (companions, drivers, demos): without bytecode on
# disk each one compiles the package anew (0.3 s a start), and pytest rewrites every test module
# again in each worker. An installed package has its bytecode, so the tests keep theirs too.
unset PYTHONDONTWRITEBYTECODE
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
took "install"
# The system packages download while lint and types are checked (mypy alone takes ~30 s on a
# fresh clone); the script waits for them before any test runs, and on a failed check too.
bash scripts/system-deps.sh &
deps=$!
trap 'wait "$deps" 2>/dev/null || true' EXIT
.venv/bin/ruff check companion tests scripts
.venv/bin/ruff format --check companion tests scripts
.venv/bin/mypy companion
took "lint and types"
wait "$deps" || true
took "system packages"
trap - EXIT
if [ "$#" -gt 0 ]; then  # a developer's selection: as asked, in one process
    exec .venv/bin/python -m pytest "$@"
fi
# The whole suite: everything but the `solo` tests on two workers (most integration tests wait on
# deadlines and peers, not on the CPU; three made deadline tests fail on 2 cores), then the `solo`
# ones, which need both cores to hold their real rates, one at a time.
WORKERS=${COMPANION_TEST_WORKERS:-2}
shared=0
.venv/bin/python -m pytest -n "$WORKERS" --dist worksteal -m "not solo" || shared=$?
took "tests on $WORKERS workers"
solo=0
# collected from the files that hold `solo` tests only (collecting all of them takes 7 s more)
mapfile -t solo_files < <(grep -rl "mark.solo" tests --include="test_*.py" | sort)
.venv/bin/python -m pytest -m solo "${solo_files[@]}" || solo=$?
took "solo tests"
if [ "$shared" -ne 0 ]; then
    exit "$shared"
fi
exit "$solo"
