"""Consolidation runs as the facade starts them: planned with the store's LLM
(``consolidation/planner.py``), applied as one undoable run (``consolidation/apply.py``), and
started by ingest when a namespace is due (``consolidation.every_n_sessions``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hybridmem_local.consolidation.apply import apply_run
from hybridmem_local.consolidation.clustering import Clusterer
from hybridmem_local.consolidation.planner import plan_consolidation
from hybridmem_local.llm.base import StructuredLLM
from hybridmem_local.memory.components import Components
from hybridmem_local.results import ConsolidationReport
from hybridmem_local.schema import MemoryKind


def consolidate(
    parts: Components,
    namespace: str,
    dry_run: bool = False,
    llm: StructuredLLM | None = None,
    clusterer: Clusterer | None = None,
    clusters: Mapping[MemoryKind, Sequence[Sequence[int]]] | None = None,
) -> ConsolidationReport:
    """Plan a run over the namespace and, unless ``dry_run``, apply it (``HybridMemory.consolidate``)."""
    report = plan_consolidation(
        parts.indexes,
        namespace,
        parts.llm if llm is None else llm,
        parts.config,
        clusterer=clusterer,
        clusters=clusters,
    )
    return report if dry_run else apply_run(parts.writer, parts.config, report)


def consolidate_if_due(
    parts: Components, namespace: str, llm: StructuredLLM | None = None, clusterer: Clusterer | None = None
) -> ConsolidationReport | None:
    """Consolidate when ``consolidation.every_n_sessions`` sessions were stored since the last
    run (0 = never); the run resets the count."""
    every = parts.config.consolidation.every_n_sessions
    if every == 0 or parts.store.runs.sessions_since_last(namespace) < every:
        return None
    return consolidate(parts, namespace, llm=llm, clusterer=clusterer)
