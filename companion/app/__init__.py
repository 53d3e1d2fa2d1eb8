"""The composition root: what each command starts, and how the pieces are wired together.

Nothing here decides a conversation or moves a byte itself: it builds nodes, engines, the
bridge, the relay and the demo's processes from options, connects them, prints the lines
scripts read (:mod:`.lines`), and runs them until a signal or cancellation. The command line
(:mod:`companion.cli`) parses arguments into these options, calls one function here and maps
what it raises to an exit status; nothing else imports this package (``docs/architecture.md``).

- :mod:`.run`: ``companion run`` (nodes, one engine per card, with :mod:`.engines`; the
  clients' node of ``--ws`` is :mod:`.clients`).
- :mod:`.bridge`: ``companion bridge`` (and the bridge of ``--ws``).
- :mod:`.relay`: ``companion relay``.
- :mod:`.demo`: ``companion demo`` (one ``companion run`` process per card, watched by a bystander).
- :mod:`.group`: companions in one process on the in-memory transport (tests, ``--in-memory``).
- :mod:`.listen`: ``companion listen`` (the terminal, the keyboard and the bridge client).
- :mod:`.trust`, :mod:`.cards`, :mod:`.paths`: the trust file, card checks, default places.
"""
