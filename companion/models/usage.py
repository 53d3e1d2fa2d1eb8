"""What a model server reported a request cost in tokens, kept apart from "it reported nothing".

llama-cpp-python's server (0.3.36, measured) sends no ``usage`` in a streamed answer, even when
``stream_options.include_usage`` asks for it. pydantic-ai's :class:`~pydantic_ai.usage.RequestUsage`
then holds 0 input and 0 output tokens, and says why: its ``unmeasured_requests`` is 1 when the
provider's answer (for a stream: the whole stream, once it ended) carried no usage at all. That
marker decides here, not the zeros: pydantic-ai sets it from the provider's raw answer, where it
knows, while "0 in, 0 out beside an answer" would be a guess, wrong for a server that really
counts 0 (an empty completion) and blind to one that counts only one side. A request without
usage is therefore logged with ``null`` counts and adds nothing to the token counters (a total
of tokens that silently took zeros for unknowns would read as cheaper than it was); it is
counted apart, so anyone reading a total can tell it leaves requests out.
"""

from __future__ import annotations

from typing import NamedTuple

from pydantic_ai.usage import RequestUsage

__all__ = ["Tokens", "reported_tokens"]


class Tokens(NamedTuple):
    """A request's tokens as its server reported them."""

    input: int
    output: int


def reported_tokens(usage: RequestUsage) -> Tokens | None:
    """The tokens ``usage`` reports, or ``None`` when the server reported none for the request."""
    if usage.unmeasured_requests:
        return None
    return Tokens(usage.input_tokens, usage.output_tokens)
