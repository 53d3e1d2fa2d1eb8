"""The per-provider pieces (SDK client, pydantic-ai model, model listing, error classes).

Each SDK is imported only when a model of its kind is made: importing the Anthropic SDK costs
about 1.5 s, which a node that talks to an OpenAI-compatible server should not pay.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import httpx2
from pydantic_ai.models import Model

from companion.models.endpoints import ProviderConfig, ProviderKind
from companion.models.servers import ListedModel

__all__ = ["Sdk", "SdkClient", "load_sdk"]


class SdkClient(Protocol):
    """What every SDK client offers that we use directly."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Sdk:
    """How to talk to one kind of provider."""

    make_client: Callable[[ProviderConfig, httpx2.AsyncClient, float], SdkClient]
    """``(config, http_client, timeout)``: an SDK client that never retries on its own."""
    make_model: Callable[[SdkClient, ProviderConfig, bool], Model]
    """``(client, config, ends_at_finish)``: a pydantic-ai model that may be asked for every
    request form of :mod:`companion.models.servers` (JSON-schema and JSON-mode output included:
    whether the server honours them is learned per endpoint, not assumed from the model's name);
    ``ends_at_finish``: its streams end at the chunk with the ``finish_reason``
    (:mod:`companion.models.finish`; for servers that send nothing after it)."""
    list_models: Callable[[SdkClient], Awaitable[list[ListedModel]]]
    """Asyncio side: the models the endpoint lists."""
    errors: tuple[type[Exception], ...]
    connection_errors: tuple[type[Exception], ...]
    read_json: Callable[[SdkClient, str], Awaitable[object]] | None = None
    """Asyncio side: ``(client, url)``, the JSON a ``GET`` of an absolute ``url`` answers through
    the client (its key and connection), for a server's own routes beside the API (llama.cpp's
    ``/props``); ``None`` for an SDK that has no such server."""


def load_sdk(kind: ProviderKind) -> Sdk:
    """The pieces for ``kind``, importing only that provider's SDK."""
    return _openai() if kind == "openai" else _anthropic()


def _openai() -> Sdk:
    import openai
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.profiles.openai import OpenAIModelProfile
    from pydantic_ai.providers.openai import OpenAIProvider

    from companion.models.finish import FinishingChatModel

    def profile(config: ProviderConfig) -> OpenAIModelProfile:
        # Local servers (llama.cpp, llama-cpp-python, Ollama, vLLM) read `max_tokens`; the newer
        # `max_completion_tokens` is silently ignored by llama-cpp-python (measured: a reply ran
        # on for 3,560 tokens), so only the OpenAI API itself gets it.
        return OpenAIModelProfile(
            supports_json_schema_output=True,
            supports_json_object_output=True,
            openai_chat_supports_max_completion_tokens=config.base_url is None,
        )

    def make_client(config: ProviderConfig, http: httpx2.AsyncClient, timeout: float) -> SdkClient:
        client: SdkClient = openai.AsyncOpenAI(
            api_key=config.api_key, base_url=config.base_url, max_retries=0, timeout=timeout, http_client=http
        )
        return client

    def make_model(client: SdkClient, config: ProviderConfig, ends_at_finish: bool) -> Model:
        assert isinstance(client, openai.AsyncOpenAI)
        provider = OpenAIProvider(openai_client=client)
        kind = FinishingChatModel if ends_at_finish else OpenAIChatModel
        return kind(config.model_name, provider=provider, profile=profile(config))

    async def list_models(client: SdkClient) -> list[ListedModel]:
        assert isinstance(client, openai.AsyncOpenAI)
        page = await client.models.list()
        return [ListedModel(m.id, str(getattr(m, "owned_by", "") or "")) for m in page.data]

    async def read_json(client: SdkClient, url: str) -> object:
        assert isinstance(client, openai.AsyncOpenAI)
        answer = await client.get(url, cast_to=httpx2.Response)  # the SDK's way to other routes
        return answer.json()

    return Sdk(
        make_client,
        make_model,
        list_models,
        (openai.APIError,),
        (openai.APIConnectionError,),
        read_json,
    )


def _anthropic() -> Sdk:
    import anthropic
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    def make_client(config: ProviderConfig, http: httpx2.AsyncClient, timeout: float) -> SdkClient:
        client: SdkClient = anthropic.AsyncAnthropic(
            api_key=config.api_key, base_url=config.base_url, max_retries=0, timeout=timeout, http_client=http
        )
        return client

    def make_model(client: SdkClient, config: ProviderConfig, ends_at_finish: bool) -> Model:
        # An Anthropic stream ends at its message_stop, which comes with its usage.
        assert isinstance(client, anthropic.AsyncAnthropic)
        return AnthropicModel(config.model_name, provider=AnthropicProvider(anthropic_client=client))

    async def list_models(client: SdkClient) -> list[ListedModel]:
        assert isinstance(client, anthropic.AsyncAnthropic)
        page = await client.models.list(limit=1000)
        return [ListedModel(m.id, "anthropic") for m in page.data]

    return Sdk(make_client, make_model, list_models, (anthropic.APIError,), (anthropic.APIConnectionError,))
