"""A companion's card: who it is, its tools, and the CEL conditions that turn parameters into
instructions.

- :mod:`.model` -- the card itself (pydantic), loaded from YAML with errors that name the field
- :mod:`.triggers` -- the card's ``events``: compiled CEL conditions over the model's parameters
- :mod:`.routines` -- the card's schedules (pure: when each routine is due)
- :mod:`.paramfit` -- parameters fitted to the card's schema before CEL reads them

Pure and synchronous: nothing here awaits or touches a socket (``tests/test_layers.py``).
"""
