"""Compile what the test suite imports, once, before its processes start (``scripts/test.sh``).

``pip install --no-compile`` leaves the virtualenv without bytecode; the first process to import
a module writes its ``.pyc``. The suite's first moments start several Python processes at once
(pytest's workers, their warm-start servers, the early tests), each of which would compile the
same 2,500 modules. Importing them here first compiles each once, and only those: pip compiled
every file it installed, most of them SDK type modules nothing imports.

The test modules too: pytest rewrites each one's asserts and keeps the result beside it, but
the workers start together and each rewrote every module before any had kept one (55 CPU
seconds for four workers to collect the suite, 24 with the rewrites kept; one collection here
costs about 10). So this collects the suite once, after the imports.

Only an optimisation: a module missing from these lists is compiled by whoever imports it first.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
TEST_TOOLS = ("pytest", "xdist", "hypothesis", "trio.testing", "_pytest.main", "pytest_trio")
"""The test runner and its plugins, which every worker imports."""


def main() -> int:
    sys.path.insert(0, str(TESTS))
    from support.zygote import PRELOAD  # what companion processes and the test helpers import

    began = time.monotonic()
    before = len(sys.modules)
    for name in (*PRELOAD, *TEST_TOOLS):
        importlib.import_module(name)
    imported = len(sys.modules) - before
    import pytest

    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        collected = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(TESTS)])
    took = time.monotonic() - began
    print(
        f"warm_imports: {imported} modules imported, tests collected (exit {int(collected)}) in {took:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
