"""Start-up errors of models, importable without the optional provider packages."""

from __future__ import annotations

from .base import ModelError

__all__ = ["ModelSetupError"]


class ModelSetupError(ModelError):
    """The model cannot be used at all (bad spec, no key, endpoint unreachable, unknown model).

    Raised at start-up by :func:`~companion.models.factory.make_model` and
    :func:`~companion.models.factory.check_model`; the message says what to fix.
    """
