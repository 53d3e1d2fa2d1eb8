"""The cyclic garbage collector during start-up: paused while modules load, then frozen.

Importing py-libp2p and the package allocates a few hundred thousand objects that live as long
as the process, and the collector, triggered by the count of allocations, scans them again and
again while they load: measured (``python -c`` importing what ``companion run`` imports before
it dials, with and without ``gc.disable()``), about 70 ms of py-libp2p's import and 70 ms of the
package's, a seventh of spawn -> first connection. ``companion run`` calls :func:`pause` before
its imports and :func:`resume` once its engines are ready: what start-up built goes to the
permanent generation (``gc.freeze``: later full collections never scan it again, so they stay
short in a long run) and collection goes on as usual. Start-up builds little garbage (cycles
among what it built stay frozen: a one-time cost, bounded by start-up itself).

Only a pause this module made is resumed: code that never paused (a test calling
:func:`~companion.app.run.run_nodes` in its own process) is left as it was.
"""

from __future__ import annotations

import gc

__all__ = ["pause", "resume"]

_paused = False


def pause() -> None:
    """Stop cyclic collection (if it runs) until :func:`resume`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """After :func:`pause`: freeze what exists now and collect again; otherwise nothing."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
