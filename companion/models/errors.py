"""Errors of models, importable without the optional provider packages."""

from __future__ import annotations

from companion.text import clip

__all__ = ["ModelError", "ModelSetupError"]

_REASON_LIMIT = 160


class ModelError(RuntimeError):
    """The model could not answer (provider down, invalid output after retries, missing key).

    ``str(error)`` is the full message for logs (which model, which call, what happened);
    ``reason`` is the short version for one transcript line ("no answer within 60 s", "the
    server ignored the forced tool call (llama-cpp-python)"). Without an explicit reason it is
    the message itself, clipped.
    """

    def __init__(self, message: str, *, reason: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = clip(reason if reason else message, _REASON_LIMIT)
        self.status = status
        """The HTTP status the server answered, when the failure was one."""


class ModelSetupError(ModelError):
    """The model cannot be used at all (bad spec, no key, endpoint unreachable, unknown model).

    Raised at start-up by :func:`~companion.models.factory.make_model` and
    :func:`~companion.models.factory.check_model`; the message says what to fix. ``reported``:
    the check already told the user (its progress line), so the command says it no more.
    """

    reported: bool = False
