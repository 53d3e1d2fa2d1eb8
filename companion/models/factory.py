"""Turn a ``--model`` spec into a model, and check it at start-up rather than mid-conversation.

Specs: ``scripted`` (the offline default), ``scripted:SEED``, ``openai:NAME`` (any
OpenAI-compatible endpoint; ``base_url`` for Ollama, llama.cpp server, vLLM) and
``anthropic:NAME``. The provider packages are an optional extra, imported only for those specs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Final

from companion.log import log_event
from companion.models.base import CompanionModel
from companion.models.endpoints import DEFAULT_REQUEST_TIMEOUT, ProviderKind, resolve_config
from companion.models.errors import ModelSetupError
from companion.models.specs import spec_kind
from companion.timings import EngineTimings

__all__ = [
    "DEFAULT_MODEL_SPEC",
    "MODEL_SPEC_FORMS",
    "check_model",
    "engine_timings",
    "is_local_model",
    "make_model",
    "stderr_progress",
]

_log = logging.getLogger(__name__)

DEFAULT_MODEL_SPEC: Final = "scripted"

MODEL_SPEC_FORMS: Final = (
    "scripted            offline, deterministic (the default); seed from --seed",
    "scripted:SEED       offline with this integer seed",
    "openai:NAME         OpenAI, or any OpenAI-compatible server with --base-url (Ollama, llama.cpp, vLLM)",
    "anthropic:NAME      Anthropic (ANTHROPIC_API_KEY)",
)


def _spec_error(spec: str, why: str) -> ModelSetupError:
    forms = "\n".join(f"  {form}" for form in MODEL_SPEC_FORMS)
    return ModelSetupError(f"model spec {spec!r}: {why}. Valid forms:\n{forms}")


def is_local_model(model: CompanionModel) -> bool:
    """Whether ``model`` is served on this machine by a server of :data:`~.servers.LOCAL_SERVERS`
    (as identified by its start-up check), or by an unidentified server on a loopback address."""
    if "companion.models.providers" not in sys.modules:
        return False  # no provider model exists before its module is imported (pydantic-ai: ~0.5 s)
    try:
        from companion.models.providers import ProviderModel, is_loopback_url
    except ImportError:  # without the ``providers`` extra no model is a provider's (the wheel's demo)
        return False
    from companion.models.servers import LOCAL_SERVERS

    if not isinstance(model, ProviderModel):
        return False
    server = model.memory.state(model.config)
    if server.identified:
        return server.server in LOCAL_SERVERS
    return model.config.base_url is not None and is_loopback_url(model.config.base_url)


def engine_timings(models: Iterable[CompanionModel], pace: float = 0.0) -> EngineTimings:
    """The engine's deadlines for these models (the slowest kind wins): offline ones for the
    scripted model alone, :meth:`~EngineTimings.local` ones when any model is served on this
    machine, the defaults otherwise. Call it after :func:`check_model`, which identifies servers."""
    from companion.models.scripted import ScriptedModel

    chosen = list(models)
    if any(is_local_model(m) for m in chosen):
        return EngineTimings.local(pace)
    if chosen and all(isinstance(m, ScriptedModel) for m in chosen):
        return EngineTimings.offline(pace)
    return EngineTimings(pace=pace)


def make_model(
    spec: str,
    *,
    base_url: str | None = None,
    seed: int = 0,
    timeout: float = DEFAULT_REQUEST_TIMEOUT,
) -> CompanionModel:
    """The model a spec names. Raises :class:`ModelSetupError` with the valid forms or the fix.

    ``seed`` applies to ``scripted`` (``scripted:SEED`` overrides it); ``base_url`` and
    ``timeout`` (seconds per provider request) apply to provider models.
    """
    kind = spec_kind(spec)
    _, sep, rest = spec.strip().partition(":")
    if kind == "scripted":
        if sep:
            try:
                seed = int(rest)
            except ValueError:
                raise _spec_error(spec, f"the seed {rest!r} is not an integer") from None
        if base_url is not None:
            log_event(_log, "base_url_ignored", logging.WARNING, spec=spec, base_url=base_url)
        from companion.models.scripted import ScriptedModel

        return ScriptedModel(seed=seed)
    if kind in ("openai", "anthropic"):
        if not rest.strip():
            raise _spec_error(spec, f"no model name after '{kind}:'")
        try:
            from companion.models.providers import ProviderModel
        except ImportError as exc:
            raise ModelSetupError(
                f"{spec} needs the optional provider packages (missing: {exc.name}). "
                "Install them with: pip install 'companion[providers]'"
            ) from exc
        provider: ProviderKind = "openai" if kind == "openai" else "anthropic"
        config = resolve_config(provider, rest.strip(), base_url=base_url, request_timeout=timeout)
        return ProviderModel(config)
    raise _spec_error(spec, "unknown kind" if spec.strip() else "empty")


def stderr_progress(line: str) -> None:
    """Progress of a long set-up step, one line on stderr (stdout stays the transcript)."""
    with contextlib.suppress(OSError, ValueError):  # a closed stderr must not cost the start-up
        print(f"companion: {line}", file=sys.stderr, flush=True)


async def check_model(
    model: CompanionModel,
    *,
    timeout: float = 10.0,
    progress: Callable[[str], None] | None = stderr_progress,
) -> None:
    """Raise :class:`ModelSetupError` now if ``model`` cannot work (offline models always can).

    For a provider model this lists the endpoint's models: it proves the endpoint answers within
    ``timeout`` seconds, accepts the key and serves the model, without spending tokens. It also
    tells which server the endpoint is, so the first request already has a form it accepts.
    ``progress`` gets a line when the check starts and one when it is done or failed, with the
    seconds it took (``None``: silent).
    """
    check = getattr(model, "check", None)
    if check is None:
        return
    where = getattr(getattr(model, "config", None), "endpoint", "")
    if progress is not None:
        progress(f"checking {model.name}{f' at {where}' if where else ''} …")
    started = time.monotonic()
    try:
        await check(timeout=timeout)
    except ModelSetupError as exc:
        if progress is not None:
            progress(f"{model.name}: failed after {time.monotonic() - started:.1f} s: {exc.reason}")
            exc.reported = True
        raise
    if progress is not None:
        server = getattr(model, "server", "")
        known = f" ({server})" if server and server != "unknown" else ""
        progress(f"{model.name} ready{known} in {time.monotonic() - started:.1f} s")
