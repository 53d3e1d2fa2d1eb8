#!/usr/bin/env bash
# One command from a fresh clone to a full test run: virtualenv, package with test extras,
# system packages the browser/voice tests need, lint, types, then the whole pytest suite.
# Extra arguments go to one plain pytest run instead (e.g. `bash scripts/test.sh -k protocol`).
set -euo pipefail
cd "$(dirname "$0")/.."

began=$SECONDS
cpu_file=$(mktemp)
cpu=0
cpu_now() {  # user + system seconds of the commands this script ran and waited for, so far
    times >"$cpu_file"  # the builtin, in this shell: in $(...) it would count a subshell's children
    cpu=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$cpu_file")
}
took() {  # one line a phase, so that a slow run says where its time went
    cpu_now
    echo "test.sh: $1 done at $((SECONDS - began)) s (CPU seconds of what ended so far: $cpu)" >&2
}
# The system packages need no virtualenv: their download starts first. Only the phase on the
# workers (browser, voice, metrics and NAT tests) waits for them.
bash scripts/system-deps.sh &
deps=$!
trap 'wait "$deps" 2>/dev/null || true' EXIT
# The suite starts hundreds of Python processes (companions, drivers, demos): without bytecode on
# disk each one compiles the package anew (0.3 s a start), and pytest rewrites every test module
# again in each worker, so the tests keep their bytecode. Compiling every file at install time
# would take most of its time on SDK type modules nothing imports: instead, what the suite
# imports is compiled once, by importing it (scripts/warm_imports.py), beside mypy, before the
# first test process starts. (scripts/venv.sh installs with uv, which compiles nothing.)
unset PYTHONDONTWRITEBYTECODE
bash scripts/venv.sh ".[test]"
took "install"
full=$(( $# == 0 ))  # no arguments: the whole suite
# Each pytest run ends with its slowest tests by wall time and by CPU seconds (tests/support/
# cputime.py), so a slow run says which tests took it, and whether they needed a core or waited.
SLOWEST=${COMPANION_TEST_SLOWEST:-30}
report=(--durations="$SLOWEST" --cpu-durations="$SLOWEST")
# Two streams run beside the phase on the workers, which lasts minutes; each writes its own log,
# shown after. (mypy ran before the workers once: they started at 158 s of a 544 s run on a fresh
# clone. Since the suite's processes start warm, tests/support/warm.py, the cores have room.)
# - `types`: mypy, strict, about 30 s of one core on a fresh clone;
# - `early-then-solo`: first the tests that need only the package and mostly build or wait (a
#   wheel in a fresh virtualenv, a minute-long conversation with a JavaScript peer, twenty mixed
#   conversations, two peers frozen against the health checks' clock), two at a time; then the
#   tests at real rates (chatter at 50 messages a second, a flood at 150, a dozen nodes started at
#   once), one at a time and never beside each other. Each of those needs about half a core
#   (`--cpu-durations`) and mostly waits. They ran beside the early ones once, when the workers,
#   mypy and the early tests' builds already filled both cores (and the workers' last minutes
#   left half a core idle): now they take that half core.
# Both end within the workers' phase, which is the critical path.
streams=()
stream() {  # stream NAME COMMAND...: a command in the background, its log kept for later
    local name=$1 log
    shift
    log=$(mktemp)
    (
        rc=0
        "$@" >"$log" 2>&1 || rc=$?
        echo "test.sh: $name tests done at $((SECONDS - began)) s (exit $rc)" >>"$log"
        exit "$rc"
    ) &
    streams+=("$name:$!:$log")
}
finish_streams() {  # waits for every stream, prints its log; the first non-zero exit is returned
    local entry name pid log rc first=0
    for entry in "${streams[@]}"; do
        IFS=: read -r name pid log <<<"$entry"
        rc=0
        wait "$pid" || rc=$?
        cat "$log"
        rm -f "$log"
        if [ "$rc" -ne 0 ] && [ "$first" -eq 0 ]; then
            first=$rc
        fi
    done
    streams=()
    return "$first"
}
trap 'wait "$deps" 2>/dev/null || true; finish_streams || true' EXIT
if [ "$full" -eq 1 ]; then
    # about half a minute of one core on a fresh clone: beside the tests, not before them
    stream types .venv/bin/mypy companion scripts tests  # strict for the tests and benchmarks too
    .venv/bin/python scripts/warm_imports.py
    took "bytecode"
fi
early_then_solo() {  # the solo tests need the cores the start of the workers' phase saturates
    local rc=0
    .venv/bin/python -m pytest -n 2 -m early "${report[@]}" "${early_files[@]}" || rc=$?
    echo "test.sh: early tests done at $((SECONDS - began)) s (exit $rc)"
    .venv/bin/python -m pytest -m solo "${report[@]}" "${solo_files[@]}" || rc=$((rc ? rc : $?))
    return "$rc"
}
if [ "$full" -eq 1 ]; then
    # collected from the files that hold such tests only (collecting all of them takes 7 s more)
    mapfile -t early_files < <(grep -rl "mark.early" tests --include="test_*.py" | sort)
    mapfile -t solo_files < <(grep -rl "mark.solo" tests --include="test_*.py" | sort -r)
    stream early-then-solo early_then_solo
fi
.venv/bin/ruff check companion tests scripts
.venv/bin/ruff format --check companion tests scripts
if [ "$full" -eq 0 ]; then
    .venv/bin/mypy companion scripts tests
fi
took "lint"
wait "$deps" || true
took "system packages"
trap 'finish_streams || true' EXIT
if [ "$full" -eq 0 ]; then  # a developer's selection: as asked, in one process
    exec .venv/bin/python -m pytest "$@"
fi
# Everything else, on four workers for two cores: most integration tests wait on deadlines and
# peers, not on the CPU (a test on a worker used a third to half of a core). On fresh clones of the
# same commit, the whole run took 422 s with three workers and 387 s with four; five, 446 s (the
# cores saturated while the early tests and mypy ran, and a leave test failed on its deadline).
WORKERS=${COMPANION_TEST_WORKERS:-4}
shared=0
.venv/bin/python -m pytest -n "$WORKERS" --dist worksteal -m "not solo and not early" "${report[@]}" || shared=$?
took "tests on $WORKERS workers"
trap - EXIT
streams_rc=0
finish_streams || streams_rc=$?
took "all"
rm -f "$cpu_file"
if [ "$shared" -ne 0 ]; then
    exit "$shared"
fi
exit "$streams_rc"
