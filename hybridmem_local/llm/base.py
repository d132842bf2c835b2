"""The one protocol every LLM backend implements.

A request is a list of chat messages plus, optionally, a pydantic model the reply must
conform to. Backends take *batches* of requests: vLLM's throughput comes from batching, so
curating many sessions is one ``generate`` call, not a Python loop of single calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

ChatRole = Literal["system", "user", "assistant"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: ChatRole
    content: str


class LLMRequest(BaseModel):
    """One generation: messages in, text (or an instance of ``output_schema``) out."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    messages: list[ChatMessage] = Field(min_length=1)
    #: Pydantic model the reply must validate against; None asks for plain text.
    output_schema: type[BaseModel] | None = None
    max_new_tokens: int | None = None
    #: Qwen3 thinking mode for this request (backends without it ignore the flag).
    enable_thinking: bool = False
    #: Recorded with the output and part of the cache key, e.g. "curation/v1".
    prompt_version: str = "unversioned"
    #: Who the request is for, e.g. the namespace; the call cache files entries under it so
    #: ``forget(namespace)`` can drop them.
    tag: str | None = None
    #: A reply cut off (at max_new_tokens, or by a backend's repetition guard) may be closed
    #: after its last complete list item and used if that validates (``replies.salvage``):
    #: for schemas whose lists are independent items, such as curation's memories.
    salvage_partial: bool = False


class LLMResult(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    text: str = ""
    #: The validated instance of ``output_schema``; None for text requests or on failure.
    parsed: BaseModel | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    #: Set when the request failed after all retries; ``text`` then holds the last raw reply.
    error: str | None = None
    #: The reply was cut off and ``parsed`` holds its complete items only (``salvage_partial``).
    salvaged: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class StructuredLLM(Protocol):
    @property
    def model_id(self) -> str:
        """Identifies backend + model for caches and run manifests, e.g. "llamacpp:smollm2-135m-instruct"."""
        ...

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        """Run a batch; one result per request, in order. Never raises for a bad reply:
        a request that still fails after the configured retries comes back with ``error`` set."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in this model's tokenizer (for context budgets and reports)."""
        ...

    def close(self) -> None:
        """Free what the backend holds (a model, engine processes, a connection). Called once, by
        whoever built the LLM: ``HybridMemory`` closes the LLM it built from its config, never one
        it was given."""
        ...
