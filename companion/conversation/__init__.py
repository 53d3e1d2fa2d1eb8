"""One companion's part in a group conversation, without I/O.

- :mod:`.machine` -- the state machine: ``receive(event, now) -> effects`` driven by its table of
  handlers (:data:`~.machine.HANDLERS`), and its deadline
- :mod:`.events` -- what the machine is fed and what it returns; the one signal reader
- :mod:`.turn` -- a turn's record, its phases and the arithmetic of its speaking slots
- :mod:`.state` -- what the machine knows between two events, and the queries over it
- :mod:`.arrays` -- which states array counts; the closing array of a turn nobody answered
- :mod:`.slots` -- the speaking slots: a reply, a failure, a peer's yield or thinking signal
- :mod:`.repair` -- the thread mended when gossip's order misled it
- :mod:`.rules` -- the rule book of turn-taking (thread, leader, states, speaker, closing)
- :mod:`.transcript` -- a bystander's account of a conversation
- :mod:`.signals` -- thinking and yield signals worded for people

The trio driver that feeds the machine is :mod:`companion.engine`.
"""
