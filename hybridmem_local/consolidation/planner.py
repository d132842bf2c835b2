"""Offline consolidation (paper §3.2, appendix C): cluster similar memories and let the LLM plan
merges and deletions. This module plans and validates; ``consolidation/apply.py`` applies a plan
as one undoable run, undoes runs and purges, on the store.

    report = memory.consolidate("alice")                    # plan_consolidation → apply_run
    memory.undo(report.run_id)                              # back to the state before the run
    memory.purge("alice", older_than=timedelta(days=90))    # physically drop old non-active rows

One run works on one namespace, on its active memories, each store (episodes, tuples) apart:

1. **Embeddings** of ``index_text()`` come from the store's embedding cache; only texts missing
   from it are embedded (and cached), nothing is re-embedded.
2. **Clustering**: UMAP → HDBSCAN (:mod:`hybridmem_local.consolidation.clustering`); noise rows are left alone.
   A cluster whose prompt would not fit ``llm.context_tokens`` (less ``max_new_tokens`` for the
   reply) is split into groups, oldest memories first.
3. **Plan**: one constrained-JSON request per group (:class:`EpisodePlan` / :class:`TuplePlan`,
   memories shown as ``M1..Mn``), all groups in one batched ``llm.generate`` call. A plan is
   checked (every id in its group and used once, merges of ≥ 2, not everything deleted);
   provenance is never taken from the LLM: a merged record cites the union of its members' turn
   ids, and its timestamp is the newest member's unless the LLM picked one of the members'.
   Plans that parse but break these rules are asked again once, in one more batch, with the
   error appended (replies that fail the schema were already retried by the LLM layer); a plan
   still invalid is skipped whole and listed in the report.
4. **Apply** (``consolidation/apply.py``) in one SQLite transaction: a ``consolidation_runs``
   row, each merge through the same supersede step as ``HybridMemory.update`` (merged row
   inserted with ``action="merge"``, its sources marked ``superseded``, ``superseded_by`` →
   merged row), deletions marked ``deleted`` with the LLM's reason, an event per change carrying
   the run id, the namespace's session counter reset. A process killed at any point leaves the
   store as it was before the run or as after it. Indexes catch up on their next use.

Nothing is physically removed by a run: undo flips statuses back, and only a purge (or
``forget``) deletes rows. The report and plan types live in ``results.py`` (the API returns them).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.config import Config
from hybridmem_local.consolidation.clustering import Clusterer, make_clusterer
from hybridmem_local.errors import ConfigError, InvalidInputError, NotFoundError, PlanError
from hybridmem_local.llm.base import ChatMessage, LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.llm.replies import feedback_request
from hybridmem_local.prompts import PromptTemplate, load_prompt
from hybridmem_local.results import (
    ConsolidationPlan,
    ConsolidationReport,
    Deletion,
    DeletionReason,
    Group,
    GroupPlan,
    Merge,
    SkippedGroup,
    StoreReport,
)
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    RelationalTuple,
    TupleDraft,
    check_namespace,
    combine_provenance,
)

if TYPE_CHECKING:
    from hybridmem_local.indexes.store_indexes import StoreIndexes

log = logging.getLogger(__name__)

KINDS: tuple[MemoryKind, ...] = ("episode", "tuple")
PROMPT_NAME = "consolidation"

Memory = Episode | RelationalTuple


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- LLM reply schemas

#: The ids a group's memories have in the prompt: M1, M2, ...
ShortId = Annotated[str, Field(pattern=r"^M[1-9][0-9]*$")]


class PlannedDeletion(_Model):
    id: ShortId
    reason: DeletionReason


class EpisodeMerge(_Model):
    member_ids: list[ShortId] = Field(min_length=2)
    merged: EpisodeDraft


class TupleMerge(_Model):
    member_ids: list[ShortId] = Field(min_length=2)
    merged: TupleDraft


class EpisodePlan(_Model):
    """The reply for a group of episodes."""

    merges: list[EpisodeMerge]
    deletions: list[PlannedDeletion]


class TuplePlan(_Model):
    """The reply for a group of relational tuples."""

    merges: list[TupleMerge]
    deletions: list[PlannedDeletion]


PLAN_SCHEMAS: dict[MemoryKind, type[EpisodePlan] | type[TuplePlan]] = {"episode": EpisodePlan, "tuple": TuplePlan}

# --------------------------------------------------------------------------- public API


def plan_consolidation(
    indexes: StoreIndexes,
    namespace: str,
    llm: StructuredLLM,
    config: Config,
    clusterer: Clusterer | None = None,
    clusters: Mapping[MemoryKind, Sequence[Sequence[int]]] | None = None,
) -> ConsolidationReport:
    """Cluster, plan and validate one consolidation run over ``namespace``; changes no memory.

    The report (``dry_run``, with ``plan`` set) counts what applying the plan would do;
    ``consolidation/apply.py`` applies it. ``clusterer`` defaults to the one
    ``config.consolidation.backend`` names. ``clusters`` skips embedding and clustering: memory
    ids grouped per store (replays, tests). Embedding may fill the store's embedding cache
    (which applying would fill anyway).
    """
    check_namespace(namespace)
    store = indexes.store
    if namespace not in store.namespaces.names():
        raise NotFoundError(f"namespace {namespace!r} does not exist")
    if clusters is not None and set(clusters) - set(KINDS):
        raise InvalidInputError(
            f"clusters: unknown store(s) {sorted(set(clusters) - set(KINDS))}; use 'episode' and 'tuple'"
        )
    report = ConsolidationReport(namespace=namespace, dry_run=True, backend="given" if clusters is not None else "")
    groups: list[tuple[Group, list[Memory]]] = []
    for kind in KINDS:
        active = store.memories.select(namespace, kind)
        stats = report.stores[kind] = StoreReport(memories_before=len(active))
        if clusters is not None:
            found = _given_clusters(namespace, kind, clusters.get(kind, ()), {m.stored_id: m for m in active})
        else:
            clusterer = clusterer or make_clusterer(config.consolidation)
            found = _cluster(indexes, namespace, active, clusterer, report, stats)
        stats.clusters = len(found)
        stats.noise = len(active) - sum(len(c) for c in found)
        for cluster in found:
            for part in _split_to_fit(cluster, llm, config.llm.context_tokens - config.llm.max_new_tokens):
                groups.append((Group(kind=kind, memory_ids=[m.stored_id for m in part]), part))

    plan = _plan(namespace, llm, groups, report)
    report.plan = plan
    report.skipped = list(plan.skipped)
    count_outcome(report, plan.groups)
    return report


def plan_request(namespace: str, kind: MemoryKind, members: Sequence[Memory]) -> LLMRequest:
    """The constrained-JSON request for one group (members in prompt order)."""
    prompt = load_prompt(PROMPT_NAME)
    return LLMRequest(
        messages=_messages(prompt, kind, [_line(f"M{i}", m) for i, m in enumerate(members, 1)]),
        output_schema=PLAN_SCHEMAS[kind],
        prompt_version=prompt.version,
        tag=namespace,
    )


def validate_plan(group: Group, members: Sequence[Memory], reply: EpisodePlan | TuplePlan) -> GroupPlan:
    """Check a reply against its group and turn short ids into memory ids; raises PlanError."""
    by_short = {f"M{i}": m for i, m in enumerate(members, 1)}
    used: set[str] = set()

    def take(short_id: str, where: str) -> Memory:
        if short_id not in by_short:
            raise PlanError(f"{where}: id {short_id!r} is not in this group (its ids are M1..M{len(members)})")
        if short_id in used:
            raise PlanError(f"{where}: id {short_id!r} is used more than once (each id at most once in the plan)")
        used.add(short_id)
        return by_short[short_id]

    planned_merges: Sequence[EpisodeMerge | TupleMerge] = reply.merges
    merges = [
        _merge([take(s, f"merges[{i}].member_ids") for s in planned.member_ids], planned.merged)
        for i, planned in enumerate(planned_merges)
    ]
    deletions = [
        Deletion(memory_id=take(planned.id, f"deletions[{i}].id").stored_id, reason=planned.reason)
        for i, planned in enumerate(reply.deletions)
    ]
    if not merges and len(deletions) == len(members):
        raise PlanError("the plan deletes every memory of the group; keep at least one")
    return GroupPlan(group=group, merges=merges, deletions=deletions)


# --------------------------------------------------------------------------- clustering


def _cluster(
    indexes: StoreIndexes,
    namespace: str,
    active: list[Memory],
    clusterer: Clusterer,
    report: ConsolidationReport,
    stats: StoreReport,
) -> list[list[Memory]]:
    if not active:
        return []
    started = time.perf_counter()
    vectors = indexes.embed(namespace, [m.index_text() for m in active])
    report.timings.embed_load_s += time.perf_counter() - started
    result = clusterer.cluster(vectors)
    report.backend = result.backend
    report.timings.umap_s += result.umap_s
    report.timings.hdbscan_s += result.hdbscan_s
    stats.clustering_skipped = result.skipped_reason
    return [[active[row] for row in rows] for rows in result.clusters().values()]


def _given_clusters(
    namespace: str, kind: MemoryKind, clusters: Sequence[Sequence[int]], active: dict[int, Memory]
) -> list[list[Memory]]:
    seen: set[int] = set()
    found = []
    for position, cluster in enumerate(clusters):
        for memory_id in cluster:
            if memory_id not in active:
                raise InvalidInputError(
                    f"clusters[{kind!r}][{position}]: memory {memory_id} is not an active {kind} of namespace "
                    f"{namespace!r}"
                )
            if memory_id in seen:
                raise InvalidInputError(
                    f"clusters[{kind!r}][{position}]: memory {memory_id} is in more than one cluster"
                )
            seen.add(memory_id)
        found.append([active[i] for i in cluster])
    return found


def _split_to_fit(cluster: list[Memory], llm: StructuredLLM, budget: int) -> list[list[Memory]]:
    """Oldest first, cut into groups whose prompt fits ``budget`` tokens; lone leftovers are dropped
    (one memory alone gives the LLM nothing to compare)."""
    if len(cluster) < 2:
        return []
    members = sorted(cluster, key=lambda m: (m.timestamp, m.id))
    kind = members[0].kind
    overhead = sum(llm.count_tokens(m.content) for m in _messages(load_prompt(PROMPT_NAME), kind, []))
    available = budget - overhead
    if available <= 0:
        raise ConfigError(
            f"llm.context_tokens leaves {budget} tokens for the prompt, the consolidation prompt alone needs {overhead}"
        )
    parts: list[list[Memory]] = [[]]
    used = 0
    for m in members:
        cost = llm.count_tokens(_line(f"M{len(members)}", m)) + 1
        if parts[-1] and used + cost > available:
            parts.append([])
            used = 0
        parts[-1].append(m)
        used += cost
    return [p for p in parts if len(p) >= 2]


# --------------------------------------------------------------------------- planning


def _messages(prompt: PromptTemplate, kind: MemoryKind, lines: list[str]) -> list[ChatMessage]:
    return prompt.messages(kind=kind, memories="\n".join(lines))


def _line(short_id: str, memory: Memory) -> str:
    """One memory as the LLM sees it: its content fields, no provenance."""
    draft = EpisodeDraft if memory.kind == "episode" else TupleDraft
    fields = [f for f in draft.model_fields if f not in ("source_turn_ids", "provenance")]
    return json.dumps({"id": short_id, **memory.model_dump(include=set(fields))}, ensure_ascii=False)


def _merge(sources: list[Memory], draft: EpisodeDraft | TupleDraft) -> Merge:
    turn_ids = list(dict.fromkeys(t for s in sources for t in s.source_turn_ids))
    stamps = [s.timestamp for s in sources]
    # ISO 8601 prefixes sort chronologically as strings.
    timestamp = draft.timestamp if draft.timestamp in stamps else max(stamps)
    sessions = {s.source_session_id for s in sources}
    return Merge(
        source_ids=[s.stored_id for s in sources],
        merged=draft.model_copy(
            update={
                "source_turn_ids": turn_ids,
                "timestamp": timestamp,
                "provenance": combine_provenance(s.provenance for s in sources),
            }
        ),
        source_session_id=sessions.pop() if len(sessions) == 1 else None,
    )


def _check(group: Group, members: list[Memory], result: LLMResult) -> GroupPlan | str:
    """A validated plan, or why the reply cannot be used."""
    if not result.ok:
        return result.error or "no reply"
    reply = result.parsed
    if not isinstance(reply, PLAN_SCHEMAS[group.kind]):
        return f"the reply is not a {PLAN_SCHEMAS[group.kind].__name__}"
    try:
        return validate_plan(group, members, reply)
    except PlanError as exc:
        return str(exc)


def _generate(llm: StructuredLLM, requests: list[LLMRequest], report: ConsolidationReport) -> list[LLMResult]:
    started = time.perf_counter()
    results = llm.generate(requests)
    report.timings.llm_s += time.perf_counter() - started
    report.llm.batches += 1
    report.llm.count(results)
    return results


def _plan(
    namespace: str, llm: StructuredLLM, groups: list[tuple[Group, list[Memory]]], report: ConsolidationReport
) -> ConsolidationPlan:
    report.llm.model_id = llm.model_id
    report.llm.prompt_version = load_prompt(PROMPT_NAME).version
    plan = ConsolidationPlan(namespace=namespace)
    if not groups:
        return plan
    requests = [plan_request(namespace, group.kind, members) for group, members in groups]
    results = _generate(llm, requests, report)
    outcomes = [_check(group, members, result) for (group, members), result in zip(groups, results, strict=True)]
    # Only plans that parsed but broke the group's rules are asked again: a reply that failed
    # (schema, cut off, transport) was already retried by the LLM layer, and retrying it on top
    # stacks two quoted replies into one prompt.
    invalid = {i: outcome for i, outcome in enumerate(outcomes) if isinstance(outcome, str) and results[i].ok}
    for i in invalid:
        report.stores[groups[i][0].kind].invalid_plans_retried += 1
    if invalid:
        retries = [feedback_request(requests[i], results[i].text, error) for i, error in invalid.items()]
        for i, result in zip(invalid, _generate(llm, retries, report), strict=True):
            outcome = _check(*groups[i], result)
            if isinstance(outcome, GroupPlan):
                outcome.attempts = 2
            outcomes[i] = outcome
    retried = set(invalid)
    for i, ((group, _), outcome) in enumerate(zip(groups, outcomes, strict=True)):
        report.stores[group.kind].llm_calls += 2 if i in retried else 1
        if isinstance(outcome, GroupPlan):
            plan.groups.append(outcome)
        else:
            log.warning("consolidation: skipping a group of %d %ss: %s", len(group.memory_ids), group.kind, outcome)
            plan.skipped.append(SkippedGroup(group=group, error=outcome))
            report.stores[group.kind].invalid_plans_skipped += 1
    return plan


# --------------------------------------------------------------------------- counting


def count_outcome(report: ConsolidationReport, applied: list[GroupPlan]) -> None:
    """Fill each store's merge and deletion counts and memories after from the applied plans."""
    for stats in report.stores.values():
        stats.merges = stats.merged_sources = stats.deletions = 0
    for plan in applied:
        stats = report.stores[plan.group.kind]
        stats.merges += len(plan.merges)
        stats.merged_sources += sum(len(m.source_ids) for m in plan.merges)
        stats.deletions += len(plan.deletions)
    for stats in report.stores.values():
        stats.memories_after = stats.memories_before - stats.merged_sources - stats.deletions + stats.merges
