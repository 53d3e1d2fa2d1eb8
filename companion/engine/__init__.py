"""The trio shell around one companion's conversation.

- :mod:`.driver` -- feeds the state machine events and carries out its effects under deadlines
- :mod:`.speech` -- the speaker's slot: parameters, triggers, the ``speak`` call
- :mod:`.voiceline` -- a line voiced a sentence at a time while the model writes it
- :mod:`.routines` -- the card's routines run on their schedule
- :mod:`.tools` -- the tool list announced to peers

It sees the network only through :mod:`companion.ports` and a model only through
:mod:`companion.models.base`.
"""
