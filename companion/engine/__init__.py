"""The trio shell around one companion's conversation.

- :mod:`.driver` -- feeds the state machine events and carries out its effects under deadlines
- :mod:`.work` -- the work those effects ask for: the leader's states, the reply, the outgoing hook
- :mod:`.directory` -- the node's directory followed as the machine's join and leave events
- :mod:`.gate` -- the door everything the engine publishes goes through, closed when it stops
- :mod:`.speech` -- the speaker's slot: parameters, triggers, the ``speak`` call
- :mod:`.voiceline` -- a line voiced a sentence at a time while the model writes it
- :mod:`.routines` -- the card's routines run on their schedule; the conversation's busy time
- :mod:`.tools` -- the tool list announced to peers, and the peers' lists

It sees the network only through :mod:`companion.ports` and a model only through
:mod:`companion.models.base`.
"""
