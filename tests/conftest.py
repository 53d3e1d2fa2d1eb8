"""The root of the test tree. pytest puts this directory on ``sys.path`` for every test, here and
in ``integration/`` and ``browser/``, so shared helpers are imported from one package:
``from support.cards import write_card``."""
