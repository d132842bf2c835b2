"""Offline consolidation (paper §3.2, appendix C): cluster similar memories, let the LLM merge or
delete, apply in one transaction, undo exactly.

    report = consolidate(memory, "alice", llm)              # cluster → plan → apply
    console.print(report.table())
    undo(memory, report.run_id)                             # back to the state before the run
    purge(memory, "alice", older_than=timedelta(days=90))   # physically drop old non-active rows

One run works on one namespace, on its active memories, each store (episodes, tuples) apart:

1. **Embeddings** of ``index_text()`` come from the store's embedding cache; only texts missing
   from it are embedded (and cached), nothing is re-embedded.
2. **Clustering**: UMAP → HDBSCAN (:mod:`hybridmem_local.clustering`); noise rows are left alone.
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
4. **Apply** in one SQLite transaction: a ``consolidation_runs`` row, merged rows inserted with
   ``action="merge"``, their sources marked ``superseded`` (``superseded_by`` → merged row),
   deletions marked ``deleted`` with the LLM's reason, an event per change carrying the run id,
   the namespace's session counter reset. A process killed at any point leaves the store as it
   was before the run or as after it. Loaded indexes are updated after the commit.

Nothing is physically removed by a run: :func:`undo` flips statuses back, and only
:func:`purge` (or ``HybridMemory.forget``) deletes rows.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field
from rich.table import Table

from hybridmem_local.clustering import Clusterer, make_clusterer
from hybridmem_local.llm.base import ChatMessage, LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.llm.replies import feedback_request
from hybridmem_local.prompts import PromptTemplate, load_prompt
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryKind,
    MemoryStatus,
    RelationalTuple,
    TupleDraft,
    check_namespace,
    utcnow,
)
from hybridmem_local.store import MemoryStore, NotFoundError, text_hash

if TYPE_CHECKING:
    from hybridmem_local.memory import HybridMemory

log = logging.getLogger(__name__)

KINDS: tuple[MemoryKind, ...] = ("episode", "tuple")
PROMPT_NAME = "consolidation"

Memory = Episode | RelationalTuple


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConsolidationError(RuntimeError):
    """A run or an undo was refused; nothing was changed."""


class PlanError(ValueError):
    """An LLM plan names ids outside its group, uses one twice, or deletes everything."""


# --------------------------------------------------------------------------- LLM reply schemas

#: The ids a group's memories have in the prompt: M1, M2, ...
ShortId = Annotated[str, Field(pattern=r"^M[1-9][0-9]*$")]
DeletionReason = Literal["outdated", "conflicting", "superseded", "duplicate"]


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

# --------------------------------------------------------------------------- validated plans


class Group(_Model):
    """Memories shown to the LLM together: one cluster, or a piece of one sized to the context."""

    kind: MemoryKind
    #: Memory ids in prompt order (oldest first): the LLM sees them as M1..Mn.
    memory_ids: list[int]


class Merge(_Model):
    source_ids: list[int]
    #: The LLM's record with provenance and timestamp already fixed by the code.
    merged: EpisodeDraft | TupleDraft
    #: The members' common session, None when they come from several.
    source_session_id: str | None = None
    #: The new row's id, once applied.
    merged_id: int | None = None


class Deletion(_Model):
    memory_id: int
    reason: DeletionReason


class GroupPlan(_Model):
    group: Group
    merges: list[Merge]
    deletions: list[Deletion]
    #: 1 when the first reply was valid, 2 when the retry was.
    attempts: int = 1

    def touched_ids(self) -> list[int]:
        return [i for m in self.merges for i in m.source_ids] + [d.memory_id for d in self.deletions]


class SkippedGroup(_Model):
    group: Group
    error: str


class ConsolidationPlan(_Model):
    namespace: str
    groups: list[GroupPlan] = Field(default_factory=list)
    skipped: list[SkippedGroup] = Field(default_factory=list)


# --------------------------------------------------------------------------- reports


class StoreReport(_Model):
    """One store's figures for a run (or, for a dry run, what the run would do)."""

    memories_before: int = 0
    memories_after: int = 0
    clusters: int = 0
    noise: int = 0
    #: Why clustering did not run (too few memories), None when it ran.
    clustering_skipped: str | None = None
    #: Requests sent for this store, retries included (one per group on the first pass).
    llm_calls: int = 0
    invalid_plans_retried: int = 0
    invalid_plans_skipped: int = 0
    merges: int = 0
    merged_sources: int = 0
    deletions: int = 0

    @property
    def compression_pct(self) -> float:
        if not self.memories_before:
            return 0.0
        return 100.0 * (self.memories_before - self.memories_after) / self.memories_before


class Timings(_Model):
    embed_load_s: float = 0.0
    umap_s: float = 0.0
    hdbscan_s: float = 0.0
    llm_s: float = 0.0
    apply_s: float = 0.0


class LLMUsage(_Model):
    model_id: str = ""
    prompt_version: str = ""
    #: ``generate`` calls: one for the first pass, one more when any plan needed a retry.
    batches: int = 0
    requests: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ConsolidationReport(_Model):
    """What a run did; stored (without ``plan``, so no memory text) in its ``consolidation_runs`` row."""

    run_id: int | None = None
    namespace: str
    dry_run: bool = False
    #: The clustering backend that ran ("cpu", "cuml"), or "given" for clusters passed in.
    backend: str = ""
    stores: dict[MemoryKind, StoreReport] = Field(default_factory=dict)
    timings: Timings = Field(default_factory=Timings)
    llm: LLMUsage = Field(default_factory=LLMUsage)
    #: Applied merges: merged row id → source ids (empty for a dry run).
    merged: dict[int, list[int]] = Field(default_factory=dict)
    #: Applied deletions: memory id → reason.
    deleted: dict[int, DeletionReason] = Field(default_factory=dict)
    skipped: list[SkippedGroup] = Field(default_factory=list)
    #: The groups and validated plans (with the merged records' text); not stored in the run row.
    plan: ConsolidationPlan | None = Field(default=None, exclude=True)

    @property
    def memories_before(self) -> int:
        return sum(s.memories_before for s in self.stores.values())

    @property
    def memories_after(self) -> int:
        return sum(s.memories_after for s in self.stores.values())

    @property
    def compression_pct(self) -> float:
        before = self.memories_before
        return 100.0 * (before - self.memories_after) / before if before else 0.0

    def table(self) -> Table:
        """A rich table: one row per store and a total; timings in the caption."""
        title = "Consolidation plan (dry run)" if self.dry_run else f"Consolidation run {self.run_id}"
        t = self.timings
        table = Table(
            title=f"{title} · namespace {self.namespace} · clustering {self.backend or '-'}",
            caption=(
                f"embeddings {t.embed_load_s:.1f}s · UMAP {t.umap_s:.1f}s · HDBSCAN {t.hdbscan_s:.1f}s · "
                f"LLM {t.llm_s:.1f}s ({self.llm.requests} requests, {self.llm.cached} cached) · apply {t.apply_s:.2f}s"
            ),
        )
        for column in ("store", "before", "after", "compression", "clusters", "noise", "LLM calls",
                       "merges", "deletions", "plans skipped"):
            table.add_column(column, justify="left" if column == "store" else "right")
        for kind, s in self.stores.items():
            table.add_row(
                f"{kind}s", str(s.memories_before), str(s.memories_after), f"{s.compression_pct:.1f}%",
                str(s.clusters), str(s.noise), str(s.llm_calls), str(s.merges), str(s.deletions),
                str(s.invalid_plans_skipped),
            )
        stores = self.stores.values()
        table.add_row(
            "total", str(self.memories_before), str(self.memories_after), f"{self.compression_pct:.1f}%",
            *(str(sum(getattr(s, f) for s in stores)) for f in ("clusters", "noise", "llm_calls", "merges",
                                                                "deletions", "invalid_plans_skipped")),
            style="bold",
        )
        return table


class UndoReport(_Model):
    run_id: int
    namespace: str
    #: Sources and deleted memories made active again.
    restored: int
    #: The run's merged rows, now marked deleted.
    removed: int


class PurgeReport(_Model):
    namespace: str
    cutoff: datetime
    memories: int
    embeddings: int
    events: int
    #: Old non-active rows kept because a newer row still points at them (superseded_by).
    kept_referenced: int


# --------------------------------------------------------------------------- public API


def consolidate(
    memory: HybridMemory,
    namespace: str,
    llm: StructuredLLM,
    clusterer: Clusterer | None = None,
    dry_run: bool = False,
    clusters: Mapping[MemoryKind, Sequence[Sequence[int]]] | None = None,
) -> ConsolidationReport:
    """Cluster, plan and (unless ``dry_run``) apply one consolidation run over ``namespace``.

    ``clusterer`` defaults to the one ``config.consolidation.backend`` names. ``clusters`` skips
    embedding and clustering: memory ids grouped per store (replays, tests). A dry run returns
    the clusters and the plan and changes no memory, event, run or counter (it may fill the
    embedding cache, which the real run would fill anyway).
    """
    check_namespace(namespace)
    store = memory.store
    if namespace not in store.namespaces():
        raise NotFoundError(f"namespace {namespace!r} does not exist")
    if clusters is not None and set(clusters) - set(KINDS):
        raise ValueError(f"clusters: unknown store(s) {sorted(set(clusters) - set(KINDS))}; use 'episode' and 'tuple'")
    report = ConsolidationReport(namespace=namespace, dry_run=dry_run, backend="given" if clusters is not None else "")
    groups: list[tuple[Group, list[Memory]]] = []
    for kind in KINDS:
        active = store.list_memories(namespace, kind)
        stats = report.stores[kind] = StoreReport(memories_before=len(active))
        if clusters is not None:
            found = _given_clusters(namespace, kind, clusters.get(kind, ()), {m.id: m for m in active})
        else:
            clusterer = clusterer or make_clusterer(memory.config.consolidation)
            found = _cluster(memory, namespace, active, clusterer, report, stats)
        stats.clusters = len(found)
        stats.noise = len(active) - sum(len(c) for c in found)
        for cluster in found:
            for part in _split_to_fit(cluster, llm, memory.config.llm.context_tokens - memory.config.llm.max_new_tokens):
                groups.append((Group(kind=kind, memory_ids=[m.id for m in part]), part))

    plan = _plan(namespace, llm, groups, report)
    report.plan = plan
    report.skipped = list(plan.skipped)
    if dry_run:
        _count_outcome(report, plan.groups)
        return report
    return _apply(memory, plan, report)


def undo(memory: HybridMemory, run_id: int) -> UndoReport:
    """Restore exactly the state before run ``run_id``, in one transaction.

    Sources and deleted memories get back their previous status, reason and pointer; the run's
    merged rows are marked deleted ("undo of run N"); the run becomes 'undone'. Refused (nothing
    changed) when a memory the run touched was changed since (by a later run: undo that one
    first) or purged.
    """
    store = memory.store
    with store.transaction():
        row = store.consolidation_run(run_id)
        if row["status"] == "undone":
            raise ConsolidationError(f"consolidation run {run_id} is already undone")
        namespace = row["namespace"]
        report = ConsolidationReport.model_validate_json(row["report"])
        changed_ids = sorted({i for sources in report.merged.values() for i in sources} | set(report.deleted))
        merged_ids = sorted(report.merged)
        touched = changed_ids + merged_ids
        current = store.status_rows(touched)
        purged = [i for i in touched if i not in current]
        if purged:
            raise ConsolidationError(
                f"cannot undo consolidation run {run_id}: memories {purged[:10]} were purged since"
            )
        last_event = {e.memory_id: e for e in store.run_events(run_id)}
        conflicts = [i for i in touched if _state(last_event[i].after) != _state(current[i])]
        if conflicts:
            raise ConsolidationError(_conflict_message(store, run_id, conflicts, last_event))
        for memory_id in changed_ids:
            before = last_event[memory_id].before
            store.set_status(
                memory_id, MemoryStatus(before["status"]), reason=before["status_reason"],
                superseded_by=before["superseded_by"], run_id=run_id, action="undo",
            )
        for memory_id in merged_ids:
            store.set_status(memory_id, MemoryStatus.deleted, reason=f"undo of run {run_id}", run_id=run_id, action="undo")
        store.mark_consolidation_run_undone(run_id)
    rows = store.get_memories(touched)
    memory._apply_to_indexes(
        namespace,
        added=[rows[i] for i in changed_ids if rows[i].status == MemoryStatus.active],
        removed=[rows[i] for i in merged_ids],
    )
    return UndoReport(run_id=run_id, namespace=namespace, restored=len(changed_ids), removed=len(merged_ids))


def purge(memory: HybridMemory, namespace: str, older_than: timedelta) -> PurgeReport:
    """Physically delete non-active memories whose last status change is older than ``older_than``.

    Their history events go too (events hold the full row, so keeping them would keep the text
    purge promises to remove), as do their cached embeddings (unless a remaining memory has the
    same text); one ``purge`` event records which ids went. A consolidation run that touched a
    purged memory can no longer be undone. Freed pages are vacuumed and the namespace's index
    files rebuilt, so no copy of the purged text or vectors stays on disk.
    """
    check_namespace(namespace)
    if older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative, got {older_than}")
    store = memory.store
    cutoff = utcnow() - older_than
    with store.transaction():
        candidates = store.retired_before(namespace, cutoff)
        pointers = store.superseded_pointers(namespace)
        doomed = set(candidates)
        # A row that a kept row still points at stays (its pointer must resolve); repeat
        # until stable, since keeping one row can keep the row it points at.
        while True:
            referenced = {target for source, target in pointers.items() if source not in doomed and target in doomed}
            if not referenced:
                break
            doomed -= referenced
        ids = sorted(doomed)
        remaining_texts = {
            text_hash(m.index_text()) for m in store.list_memories(namespace, status=None) if m.id not in doomed
        }
        purged_texts = {text_hash(m.index_text()) for m in store.get_memories(ids).values()} - remaining_texts
        events, embeddings = store.delete_memories(
            namespace, ids, sorted(purged_texts), {"memory_ids": ids, "cutoff": cutoff.isoformat()}, f"older than {older_than}"
        )
    if ids:
        store.vacuum()
        if store.path is not None:
            memory.rebuild_indexes(namespace)  # hnswlib keeps vectors of deleted labels
    return PurgeReport(
        namespace=namespace, cutoff=cutoff, memories=len(ids), embeddings=embeddings, events=events,
        kept_referenced=len(candidates) - len(ids),
    )


def maybe_consolidate(
    memory: HybridMemory, namespace: str, llm: StructuredLLM, clusterer: Clusterer | None = None
) -> ConsolidationReport | None:
    """Run :func:`consolidate` when ``consolidation.every_n_sessions`` sessions were ingested
    since the last run (0 = never); the run resets the counter."""
    every = memory.config.consolidation.every_n_sessions
    if every == 0:
        return None
    if memory.store.sessions_since_consolidation(namespace) < every:
        return None
    return consolidate(memory, namespace, llm, clusterer)


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

    merges = [
        _merge([take(s, f"merges[{i}].member_ids") for s in planned.member_ids], planned.merged)
        for i, planned in enumerate(reply.merges)
    ]
    deletions = [
        Deletion(memory_id=take(planned.id, f"deletions[{i}].id").id, reason=planned.reason)
        for i, planned in enumerate(reply.deletions)
    ]
    if not merges and len(deletions) == len(members):
        raise PlanError("the plan deletes every memory of the group; keep at least one")
    return GroupPlan(group=group, merges=merges, deletions=deletions)


# --------------------------------------------------------------------------- clustering


def _cluster(
    memory: HybridMemory,
    namespace: str,
    active: list[Memory],
    clusterer: Clusterer,
    report: ConsolidationReport,
    stats: StoreReport,
) -> list[list[Memory]]:
    if not active:
        return []
    started = time.perf_counter()
    vectors = memory._embed_cached(namespace, [m.index_text() for m in active])
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
                raise ValueError(
                    f"clusters[{kind!r}][{position}]: memory {memory_id} is not an active {kind} of namespace {namespace!r}"
                )
            if memory_id in seen:
                raise ValueError(f"clusters[{kind!r}][{position}]: memory {memory_id} is in more than one cluster")
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
        raise ValueError(
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
    fields = [f for f in draft.model_fields if f != "source_turn_ids"]
    return json.dumps({"id": short_id, **memory.model_dump(include=set(fields))}, ensure_ascii=False)


def _merge(sources: list[Memory], draft: EpisodeDraft | TupleDraft) -> Merge:
    turn_ids = list(dict.fromkeys(t for s in sources for t in s.source_turn_ids))
    stamps = [s.timestamp for s in sources]
    # ISO 8601 prefixes sort chronologically as strings.
    timestamp = draft.timestamp if draft.timestamp in stamps else max(stamps)
    sessions = {s.source_session_id for s in sources}
    return Merge(
        source_ids=[s.id for s in sources],
        merged=draft.model_copy(update={"source_turn_ids": turn_ids, "timestamp": timestamp}),
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
    usage = report.llm
    usage.batches += 1
    usage.requests += len(requests)
    usage.cached += sum(r.cached for r in results)
    usage.prompt_tokens += sum(r.prompt_tokens for r in results)
    usage.completion_tokens += sum(r.completion_tokens for r in results)
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
    invalid = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, str) and results[i].ok]
    for i in invalid:
        report.stores[groups[i][0].kind].invalid_plans_retried += 1
    if invalid:
        retries = [feedback_request(requests[i], results[i].text, outcomes[i]) for i in invalid]
        for i, result in zip(invalid, _generate(llm, retries, report), strict=True):
            outcome = _check(*groups[i], result)
            if isinstance(outcome, GroupPlan):
                outcome.attempts = 2
            outcomes[i] = outcome
    retried = set(invalid)
    for i, ((group, _), outcome) in enumerate(zip(groups, outcomes)):
        report.stores[group.kind].llm_calls += 2 if i in retried else 1
        if isinstance(outcome, GroupPlan):
            plan.groups.append(outcome)
        else:
            log.warning("consolidation: skipping a group of %d %ss: %s", len(group.memory_ids), group.kind, outcome)
            plan.skipped.append(SkippedGroup(group=group, error=outcome))
            report.stores[group.kind].invalid_plans_skipped += 1
    return plan


# --------------------------------------------------------------------------- applying


def _stored(merge: Merge, namespace: str) -> Memory:
    cls = Episode if isinstance(merge.merged, EpisodeDraft) else RelationalTuple
    return cls(namespace=namespace, source_session_id=merge.source_session_id, **merge.merged.model_dump())


def _count_outcome(report: ConsolidationReport, applied: list[GroupPlan]) -> None:
    for plan in applied:
        stats = report.stores[plan.group.kind]
        stats.merges += len(plan.merges)
        stats.merged_sources += sum(len(m.source_ids) for m in plan.merges)
        stats.deletions += len(plan.deletions)
    for stats in report.stores.values():
        stats.memories_after = stats.memories_before - stats.merged_sources - stats.deletions + stats.merges


def _apply(memory: HybridMemory, plan: ConsolidationPlan, report: ConsolidationReport) -> ConsolidationReport:
    store, namespace = memory.store, plan.namespace
    started = time.perf_counter()
    merged_texts = [_stored(m, namespace).index_text() for g in plan.groups for m in g.merges]
    if merged_texts:
        # Embedded before the transaction: a failure there changes nothing.
        memory._embed_cached(namespace, merged_texts)
    config = memory.config.consolidation
    params = {
        "consolidation": config.model_dump(mode="json"),
        "context_tokens": memory.config.llm.context_tokens,
        "max_new_tokens": memory.config.llm.max_new_tokens,
        "llm_model_id": report.llm.model_id,
        "prompt_version": report.llm.prompt_version,
    }
    applied: list[GroupPlan] = []
    with store.transaction():
        run_id = store.start_consolidation_run(namespace, report.backend, params)
        report.run_id = run_id
        for group_plan in plan.groups:
            stale = _not_active(store, group_plan.touched_ids())
            if stale:
                # Another process changed these since planning: skip the group, not the run.
                report.skipped.append(SkippedGroup(group=group_plan.group, error=f"memories {stale} changed since planning"))
                report.stores[group_plan.group.kind].invalid_plans_skipped += 1
                continue
            for merge in group_plan.merges:
                (merge.merged_id,) = store.insert_memories(namespace, [_stored(merge, namespace)], run_id=run_id, action="merge")
                for source_id in merge.source_ids:
                    store.set_status(source_id, MemoryStatus.superseded, reason=f"merged by consolidation run {run_id}",
                                     superseded_by=merge.merged_id, run_id=run_id)
                report.merged[merge.merged_id] = merge.source_ids
            for deletion in group_plan.deletions:
                store.set_status(deletion.memory_id, MemoryStatus.deleted, reason=deletion.reason, run_id=run_id)
                report.deleted[deletion.memory_id] = deletion.reason
            applied.append(group_plan)
        _count_outcome(report, applied)
        report.timings.apply_s = time.perf_counter() - started
        store.finish_consolidation_run(run_id, namespace, report.model_dump_json())
    changed = store.get_memories([i for g in applied for i in g.touched_ids()] + list(report.merged))
    memory._apply_to_indexes(
        namespace,
        added=[changed[i] for i in report.merged],
        removed=[changed[i] for g in applied for i in g.touched_ids()],
    )
    log.info("consolidation run %d on %s: %d → %d memories", run_id, namespace, report.memories_before, report.memories_after)
    return report


# --------------------------------------------------------------------------- helpers


def _not_active(store: MemoryStore, ids: Sequence[int]) -> list[int]:
    rows = store.status_rows(ids)
    return [i for i in ids if i not in rows or rows[i]["status"] != MemoryStatus.active.value]


def _state(row: Mapping[str, Any] | None) -> tuple:
    row = row or {}
    return row.get("status"), row.get("superseded_by"), row.get("status_reason")


def _conflict_message(store: MemoryStore, run_id: int, conflicts: list[int], last_event: Mapping[int, Any]) -> str:
    later = store.events_after(conflicts, min(last_event[i].id for i in conflicts))
    causes = sorted({f"run {e.run_id}" if e.run_id is not None else f"a {e.action!r} event" for e in later
                     if e.run_id != run_id})
    hint = "; undo the later run(s) first" if any(c.startswith("run ") for c in causes) else ""
    return (
        f"cannot undo consolidation run {run_id}: memories {conflicts[:10]} were changed after it "
        f"(by {', '.join(causes) or 'another change'}){hint}"
    )
