"""A process that says what it was started with (``tests/test_warm_start.py``): its PID, its
arguments, a variable of its environment, its stdin, its working directory and the first entry
of its module path, its session; exits 7. With ``wait`` as its
argument it says ``waiting`` and waits for a signal instead (at most 60 s)."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    if sys.argv[1:] == ["wait"]:
        print("waiting", flush=True)
        time.sleep(60)
        return
    said = {
        "pid": os.getpid(),
        "argv": sys.argv,
        "env": os.environ.get("COMPANION_PROBE"),
        "name": __name__,
        "stdin": sys.stdin.read(),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "session_leader": os.getsid(0) == os.getpid(),
    }
    print(json.dumps(said))
    print("to stderr", file=sys.stderr)
    sys.exit(7)


if __name__ == "__main__":
    main()
