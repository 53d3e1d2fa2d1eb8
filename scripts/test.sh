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
full=$(( $# == 0 ))  # no arguments: the whole suite
# Each phase ends with its slowest tests and their times, so a slow run says which tests took it.
SLOWEST=${COMPANION_TEST_SLOWEST:-30}
# The `early` tests (a wheel built and installed into a fresh virtualenv, a minute-long conversation
# that is mostly silence, twenty mixed conversations with JavaScript peers, two peers frozen and
# woken against the health checks' clock) need only the package and mostly wait: they run side by
# side while lint and types are checked, which keep one core busy, and on into the first two
# minutes of the rest (which lasts five), instead of holding the two workers (or, for the mixed
# conversations and the frozen peers, the one-at-a-time solo phase) for 210 s.
early=""
if [ "$full" -eq 1 ]; then
    early_log=$(mktemp)
    mapfile -t early_files < <(grep -rl "mark.early" tests --include="test_*.py" | sort)
    .venv/bin/python -m pytest -n 2 -m early --durations=0 "${early_files[@]}" >"$early_log" 2>&1 &
    early=$!
fi
# The system packages download meanwhile too (mypy alone takes ~30 s on a fresh clone); the
# script waits for them before any other test runs, and for both on a failed check too.
bash scripts/system-deps.sh &
deps=$!
finish_early() {
    if [ -n "$early" ]; then
        wait "$early" || return $?
    fi
}
show_early() {
    if [ -n "$early" ]; then
        cat "$early_log"
        rm -f "$early_log"
    fi
}
trap 'wait "$deps" 2>/dev/null || true; finish_early 2>/dev/null || true; show_early' EXIT
.venv/bin/ruff check companion tests scripts
.venv/bin/ruff format --check companion tests scripts
.venv/bin/mypy companion scripts tests  # strict for the tests and benchmarks too
took "lint and types"
wait "$deps" || true
took "system packages"
trap 'finish_early 2>/dev/null || true; show_early' EXIT
if [ "$full" -eq 0 ]; then  # a developer's selection: as asked, in one process
    exec .venv/bin/python -m pytest "$@"
fi
# The whole suite: everything else but the `solo` tests on two workers (most integration tests wait
# on deadlines and peers, not on the CPU; three made deadline tests fail on 2 cores), then the
# `solo` ones, which need both cores to hold their real rates, one at a time, once the early ones
# are done.
WORKERS=${COMPANION_TEST_WORKERS:-2}
shared=0
.venv/bin/python -m pytest -n "$WORKERS" --dist worksteal -m "not solo and not early" \
    --durations="$SLOWEST" || shared=$?
took "tests on $WORKERS workers"
early_rc=0
finish_early || early_rc=$?
took "early tests"
trap - EXIT
show_early
solo=0
# collected from the files that hold `solo` tests only (collecting all of them takes 7 s more)
mapfile -t solo_files < <(grep -rl "mark.solo" tests --include="test_*.py" | sort)
.venv/bin/python -m pytest -m solo --durations=0 "${solo_files[@]}" || solo=$?
took "solo tests"
for rc in "$shared" "$early_rc"; do
    if [ "$rc" -ne 0 ]; then
        exit "$rc"
    fi
done
exit "$solo"
