"""What a piece of work asked of an LLM: the one usage record that curation, consolidation,
ingest and evaluation count with and report.

    usage = LLMUsage()
    usage.count(llm.generate(requests))
    usage.model_calls  # requests the cache did not answer
"""

from __future__ import annotations

from collections.abc import Iterable

from hybridmem_local.llm.base import LLMResult
from hybridmem_local.schema import StrictModel


class LLMUsage(StrictModel):
    """Requests sent and tokens spent; ``requests - cached`` reached the model."""

    #: Requests sent, cache hits and failed ones included.
    requests: int = 0
    #: Requests the on-disk call cache answered (no model time).
    cached: int = 0
    #: Requests that came back without a usable reply.
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Model seconds the backend reported (the sum of request latencies; cache hits count 0).
    llm_s: float = 0.0

    @property
    def model_calls(self) -> int:
        return self.requests - self.cached

    def count(self, results: Iterable[LLMResult]) -> None:
        """Add the results of one ``generate`` call."""
        for result in results:
            self.requests += 1
            self.cached += result.cached
            self.failed += not result.ok
            self.prompt_tokens += result.prompt_tokens
            self.completion_tokens += result.completion_tokens
            self.llm_s += 0.0 if result.cached else result.latency_s

    def add(self, other: LLMUsage) -> None:
        """Add every figure of ``other`` (of this type or a subclass) to this one."""
        for name in LLMUsage.model_fields:
            setattr(self, name, getattr(self, name) + getattr(other, name))
