"""A streamed OpenAI-compatible answer that ends at the chunk carrying its ``finish_reason``.

pydantic-ai reads a stream to its ``[DONE]``: the chunk with the ``finish_reason`` yields no event,
so a line whose last sentence waits for the stream's end waits for ``[DONE]`` too. Most servers
send ``[DONE]`` at once, or after a usage chunk the token counts need. llama-cpp-python sends no
usage, and with ``--cache true`` it copies its state into the cache between the two (measured
with SmolLM2-135M: 40-130 ms after every answer). The server still makes the copy when the
client has gone (it runs in the thread that wrote the answer), so ending the stream at the finish
chunk loses nothing: the line's last sentence is voiced, and its ``message.send`` published, that
much sooner. Only for :data:`~.servers.SERVERS_WITHOUT_STREAM_USAGE`; every other stream is read
to its end.

The same server ends the stream in progress with ``[DONE]`` and no finish chunk when another
request comes (``interrupt_requests``, its default; measured with SmolLM2: a story ended after 24
chunks when a second request came 0.5 s in). pydantic-ai reads a stream with no finish reason
as one that stopped (``"stop"``), so the half-written sentence would be voiced and published as
a whole line. Here such a stream counts as cut at its limit (``"length"``): only its complete
sentences are said (:func:`~.streaming.whole_sentences`), and :func:`~.streaming.ended_early`
tells it apart for the log.

pydantic-ai documents the three hooks used here for subclasses:
``OpenAIChatModel._streamed_response_cls``, ``OpenAIStreamedResponse._validate_response`` and
``OpenAIStreamedResponse._missing_finish_reason``.
Imported only with the OpenAI SDK (:mod:`.sdks`).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

from openai.types.chat import ChatCompletionChunk
from pydantic_ai.messages import FinishReason
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIStreamedResponse

from companion.models.streaming import ENDED_EARLY

__all__ = ["FinishingChatModel", "FinishingStreamedResponse", "until_finish"]


async def until_finish(chunks: AsyncIterable[ChatCompletionChunk]) -> AsyncIterator[ChatCompletionChunk]:
    """``chunks`` up to and with the first one whose choice carries a ``finish_reason``."""
    async for chunk in chunks:
        yield chunk
        if any(choice.finish_reason for choice in chunk.choices or ()):
            return


class FinishingStreamedResponse(OpenAIStreamedResponse):
    """An OpenAI-compatible stream that ends at its finish chunk (see the module)."""

    def _validate_response(self) -> AsyncIterable[ChatCompletionChunk]:
        return until_finish(super()._validate_response())

    def _missing_finish_reason(self) -> FinishReason:
        """A stream with no finish chunk was cut by the server (see the module)."""
        self.provider_details = {**(self.provider_details or {}), ENDED_EARLY: True}
        return "length"


class FinishingChatModel(OpenAIChatModel):
    """pydantic-ai's OpenAI chat model whose streams end at their finish chunk."""

    @property
    def _streamed_response_cls(self) -> type[OpenAIStreamedResponse]:
        return FinishingStreamedResponse
