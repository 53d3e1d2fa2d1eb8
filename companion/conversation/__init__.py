"""One companion's part in a group conversation, without I/O.

- :mod:`.machine` -- the state machine: ``receive(event, now) -> effects`` and its deadline
- :mod:`.rules` -- the rule book of turn-taking (thread, leader, states, speaker, closing)
- :mod:`.transcript` -- a bystander's account of a conversation
- :mod:`.signals` -- thinking and yield signals worded for people

The trio driver that feeds the machine is :mod:`companion.engine`.
"""
