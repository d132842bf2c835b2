"""Consolidation runs on the store: apply a plan (``planner.py`` made it) as one undoable run,
undo a run, and purge what runs and edits retired.

    report = apply_run(writer, config, plan_consolidation(indexes, "alice", llm, config))
    undo_run(store, report.run_id)                           # back to the state before the run
    purge(indexes, "alice", older_than=timedelta(days=90))   # physically drop old non-active rows

A run changes statuses only (merged rows are new rows, through the store's ``supersede``), so
undo is a status flip checked against the run's own events; only a purge (or ``forget``)
removes rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from hybridmem_local.config import Config
from hybridmem_local.consolidation.planner import count_outcome
from hybridmem_local.errors import ConsolidationError, InvalidInputError, NotFoundError
from hybridmem_local.indexes.store_indexes import StoreIndexes
from hybridmem_local.indexes.writer import MemoryWriter
from hybridmem_local.results import ConsolidationReport, Merge, PurgeReport, SkippedGroup, UndoReport
from hybridmem_local.schema import Episode, EpisodeDraft, MemoryStatus, RelationalTuple, check_namespace, utcnow
from hybridmem_local.storage.embedding_cache import text_hash
from hybridmem_local.storage.store import MemoryStore

log = logging.getLogger(__name__)


def apply_run(writer: MemoryWriter, config: Config, report: ConsolidationReport) -> ConsolidationReport:
    """Apply a planned run in one transaction: a ``consolidation_runs`` row, each merge through
    the store's ``supersede`` (action ``merge``), each deletion a status change, all events
    carrying the run id, the namespace's session count reset. A group whose memories were
    changed since planning is skipped, not the run. Returns the report, now of the applied run."""
    plan = report.plan
    if plan is None or report.run_id is not None:
        raise InvalidInputError("apply_consolidation takes a planned report (with a plan, not applied yet)")
    store, namespace, started = writer.store, plan.namespace, time.perf_counter()
    merges = [merge for group_plan in plan.groups for merge in group_plan.merges]
    embedded = writer.embed(namespace, [stored_merge(m, namespace).index_text() for m in merges])
    report.dry_run, report.merged, report.deleted = False, {}, {}
    applied = []
    with writer.transaction(embedded):
        run_id = report.run_id = store.runs.start(namespace, report.backend, run_params(config, report))
        for group_plan in plan.groups:
            stale = store.memories.not_active(group_plan.touched_ids())
            if stale:
                report.skipped.append(
                    SkippedGroup(group=group_plan.group, error=f"memories {stale} changed since planning")
                )
                report.stores[group_plan.group.kind].invalid_plans_skipped += 1
                continue
            for merge in group_plan.merges:
                merge.merged_id = store.memories.supersede(
                    namespace,
                    merge.source_ids,
                    stored_merge(merge, namespace),
                    reason=f"merged by consolidation run {run_id}",
                    action="merge",
                    run_id=run_id,
                )
                report.merged[merge.merged_id] = merge.source_ids
            for deletion in group_plan.deletions:
                store.memories.set_status(
                    deletion.memory_id, MemoryStatus.deleted, reason=deletion.reason, run_id=run_id
                )
                report.deleted[deletion.memory_id] = deletion.reason
            applied.append(group_plan)
        count_outcome(report, applied)
        report.timings.apply_s = time.perf_counter() - started
        store.runs.finish(run_id, namespace, report.model_dump_json())
    log.info(
        "consolidation run %d on %s: %d → %d memories", run_id, namespace, report.memories_before, report.memories_after
    )
    return report


def stored_merge(merge: Merge, namespace: str) -> Episode | RelationalTuple:
    """The record a merge stores."""
    cls = Episode if isinstance(merge.merged, EpisodeDraft) else RelationalTuple
    return cls(namespace=namespace, source_session_id=merge.source_session_id, **merge.merged.model_dump())


def run_params(config: Config, report: ConsolidationReport) -> dict[str, Any]:
    """The settings a run is stored with (its ``consolidation_runs.params``)."""
    return {
        "consolidation": config.consolidation.model_dump(mode="json"),
        "context_tokens": config.llm.context_tokens,
        "max_new_tokens": config.llm.max_new_tokens,
        "llm_model_id": report.llm.model_id,
        "prompt_version": report.llm.prompt_version,
    }


# --------------------------------------------------------------------------- undo


class UndoPlan(BaseModel):
    """What undoing a run changes, checked against the store's current state."""

    model_config = ConfigDict(extra="forbid")

    namespace: str
    #: Sources and deleted memories → the row state (status, reason, pointer) to restore.
    restore: dict[int, dict[str, Any]]
    #: The run's merged rows, to be marked deleted.
    merged_ids: list[int]


def undo_run(store: MemoryStore, run_id: int, namespace: str | None = None) -> UndoReport:
    """Restore exactly the state before run ``run_id``, in one transaction: sources and deleted
    memories get back their previous status, reason and pointer, the run's merged rows are marked
    deleted, the run becomes 'undone'. With ``namespace``, only a run of that namespace
    (NotFoundError otherwise); ConsolidationError as :func:`plan_undo` says."""
    if namespace is not None:
        try:
            run_namespace = store.runs.get(run_id).namespace
        except NotFoundError:
            run_namespace = None
        if run_namespace != namespace:
            raise NotFoundError(f"no consolidation run {run_id} in namespace {namespace!r}")
    with store.transaction():
        plan = plan_undo(store, run_id)
        for memory_id, before in plan.restore.items():
            store.memories.set_status(
                memory_id,
                MemoryStatus(before["status"]),
                reason=before["status_reason"],
                superseded_by=before["superseded_by"],
                run_id=run_id,
                action="undo",
            )
        for memory_id in plan.merged_ids:
            store.memories.set_status(
                memory_id, MemoryStatus.deleted, reason=f"undo of run {run_id}", run_id=run_id, action="undo"
            )
        store.runs.mark_undone(run_id)
    return UndoReport(run_id=run_id, namespace=plan.namespace, restored=len(plan.restore), removed=len(plan.merged_ids))


def plan_undo(store: MemoryStore, run_id: int) -> UndoPlan:
    """Check that run ``run_id`` can be undone and say what undoing changes; raises
    ConsolidationError when it is undone already, or a memory it touched was purged or changed
    since (by a later run: undo that one first). Call it inside the transaction that applies it."""
    row = store.runs.get(run_id)
    if row.status == "undone":
        raise ConsolidationError(f"consolidation run {run_id} is already undone")
    report = ConsolidationReport.model_validate_json(row.report)
    changed_ids = sorted({i for sources in report.merged.values() for i in sources} | set(report.deleted))
    merged_ids = sorted(report.merged)
    touched = changed_ids + merged_ids
    current = store.memories.status_rows(touched)
    purged = [i for i in touched if i not in current]
    if purged:
        raise ConsolidationError(f"cannot undo consolidation run {run_id}: memories {purged[:10]} were purged since")
    last_event = {e.memory_id: e for e in store.events.of_run(run_id) if e.memory_id is not None}
    conflicts = [i for i in touched if _state(last_event[i].after) != _state(current[i])]
    if conflicts:
        raise ConsolidationError(_conflict_message(store, run_id, conflicts, last_event))
    restore = {i: before for i in changed_ids if (before := last_event[i].before) is not None}
    if len(restore) < len(changed_ids):
        unrecorded = sorted(set(changed_ids) - set(restore))
        raise ConsolidationError(
            f"cannot undo consolidation run {run_id}: the events of memories {unrecorded[:10]} do not record their "
            "state before it"
        )
    return UndoPlan(namespace=row.namespace, restore=restore, merged_ids=merged_ids)


def _state(row: Mapping[str, Any] | None) -> tuple:
    row = row or {}
    return row.get("status"), row.get("superseded_by"), row.get("status_reason")


def _conflict_message(store: MemoryStore, run_id: int, conflicts: list[int], last_event: Mapping[int, Any]) -> str:
    later = store.events.after(conflicts, min(last_event[i].id for i in conflicts))
    causes = sorted(
        {f"run {e.run_id}" if e.run_id is not None else f"a {e.action!r} event" for e in later if e.run_id != run_id}
    )
    hint = "; undo the later run(s) first" if any(c.startswith("run ") for c in causes) else ""
    return (
        f"cannot undo consolidation run {run_id}: memories {conflicts[:10]} were changed after it "
        f"(by {', '.join(causes) or 'another change'}){hint}"
    )


# --------------------------------------------------------------------------- purge


def purge(indexes: StoreIndexes, namespace: str, older_than: timedelta) -> PurgeReport:
    """Physically delete the namespace's non-active memories whose last status change is older
    than ``older_than``, with their events and cached embeddings (unless a remaining memory has
    the same text), recorded by one ``purge`` event; then scrub the store and rebuild the
    namespace's index files, so no copy of the purged text or vectors stays on disk. A row a
    kept row points at (``superseded_by``) is kept."""
    check_namespace(namespace)
    if older_than < timedelta(0):
        raise InvalidInputError(f"older_than must not be negative, got {older_than}")
    store = indexes.store
    cutoff = utcnow() - older_than
    with store.transaction():
        candidates = store.memories.retired_before(namespace, cutoff)
        doomed = _unreferenced(candidates, store.memories.superseded_pointers(namespace))
        ids = sorted(doomed)
        remaining_texts = {
            text_hash(m.index_text()) for m in store.memories.select(namespace, status=None) if m.id not in doomed
        }
        purged_texts = {text_hash(m.index_text()) for m in store.memories.get_many(ids).values()} - remaining_texts
        events, embeddings = store.delete_memories(
            namespace,
            ids,
            sorted(purged_texts),
            {"memory_ids": ids, "cutoff": cutoff.isoformat()},
            f"older than {older_than}",
        )
    scrub_pending = False
    if ids:
        scrub_pending = not store.scrub().done
        if store.path is not None:
            indexes.rebuild(namespace)  # hnswlib keeps vectors of deleted labels
    return PurgeReport(
        namespace=namespace,
        cutoff=cutoff,
        memories=len(ids),
        embeddings=embeddings,
        events=events,
        kept_referenced=len(candidates) - len(ids),
        scrub_pending=scrub_pending,
    )


def _unreferenced(candidates: set[int], pointers: dict[int, int]) -> set[int]:
    """The candidates no kept row points at (its pointer must resolve); repeated until stable,
    since keeping one row can keep the row it points at."""
    doomed = set(candidates)
    while True:
        referenced = {target for source, target in pointers.items() if source not in doomed and target in doomed}
        if not referenced:
            return doomed
        doomed -= referenced
