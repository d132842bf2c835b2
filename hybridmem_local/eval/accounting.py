"""LLM accounting of an evaluation run: per-phase usage and the metered view of a shared backend.

Every phase (curation, consolidation, retrieval, answering, judging, the judge audit) counts into its own
:class:`PhaseUsage`; the runner sums them per invocation and appends one row per phase,
conversation and system to ``usage.jsonl`` as each ends, from which the report's cost table is built.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridmem_local.llm.base import LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.usage import LLMUsage

PHASES = ("curation", "consolidation", "retrieval", "answering", "judging", "judge_audit")


class PhaseUsage(LLMUsage):
    """What one phase asked of an LLM, with the time the runner measured around it."""

    #: Wall-clock seconds of the phase as the runner timed it.
    wall_s: float = 0.0
    #: Sessions (curation, consolidation) or questions (retrieval, answering, judging) covered.
    units: int = 0

    def add(self, other: LLMUsage) -> None:
        super().add(other)
        if isinstance(other, PhaseUsage):
            self.wall_s += other.wall_s
            self.units += other.units

    def take(self) -> PhaseUsage:
        """What was counted so far, this usage starting again from zero (the LLM metering into
        it keeps counting into it): a phase recorded in parts."""
        taken = self.model_copy()
        for name, field in type(self).model_fields.items():
            setattr(self, name, field.get_default(call_default_factory=True))
        return taken


class MeteredLLM:
    """A :class:`StructuredLLM` view of a shared backend that counts what passes through it.

    The stores it is given to do not close it (a given LLM stays its giver's), and its own
    ``close`` leaves the backend alone: the whole run shares it (``Models.close`` closes it).
    """

    def __init__(self, inner: StructuredLLM, usage: LLMUsage):
        self.inner = inner
        self.model_id = inner.model_id
        self.usage = usage

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResult]:
        results = self.inner.generate(requests)
        self.usage.count(results)
        return results

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def close(self) -> None:
        """Nothing: the shared backend is the run's to close."""
