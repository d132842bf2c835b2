"""Ingest and curation: sessions stored (raw and queued, or curated at once in batches), the
queue of sessions waiting for a curator, and the consolidation their namespaces are then due.

A session and its curated memories land in one transaction. A forget request in a session (the
rules of ``curation/redaction.py``) is redacted as the session is stored, so nothing it names is
ever served, whatever the curation backlog; curation may find more (``redact_curated``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from hybridmem_local.curation import redaction_apply
from hybridmem_local.curation.curator import CurationOutcome, Curator
from hybridmem_local.errors import AlreadyCuratedError, DuplicateSessionError, NotFoundError, QueueFullError
from hybridmem_local.memory.components import Components
from hybridmem_local.memory.runs import consolidate_if_due
from hybridmem_local.memory.writes import write_memories
from hybridmem_local.results import AddSessionResult, IngestReport
from hybridmem_local.schema import Session, SessionRecord

log = logging.getLogger(__name__)

#: Told after each curated batch: (sessions done, sessions in all). The CLI draws a bar with it.
ProgressCallback = Callable[[int, int], None]


def add_session(parts: Components, session: Session) -> AddSessionResult:
    """One session stored and curated (or queued), with the memories curated from it."""
    report = IngestReport()
    stored = store_sessions(parts, [session], curate=True, report=report, on_progress=None)
    ids = stored.get((session.namespace, session.session_id), [])
    return AddSessionResult(
        session=parts.store.sessions.get(session.namespace, session.session_id),
        memories=list(parts.store.memories.get_many(ids).values()),
        report=report,
    )


def enqueue(parts: Components, sessions: Sequence[Session], max_pending: int | None) -> list[SessionRecord]:
    """Sessions stored raw as ``pending``, each redacted as its forget requests ask, in one
    transaction: all or none (``HybridMemory.enqueue``)."""
    store = parts.store
    redacted: set[str] = set()
    with store.transaction():
        # Counted inside the write transaction: no other writer can add pending rows meanwhile.
        pending = store.sessions.count("pending")
        if max_pending is not None and pending + len(sessions) > max_pending:
            raise QueueFullError(
                f"the curation queue holds {pending} sessions; adding {len(sessions)} would pass "
                f"service.max_pending_sessions={max_pending}"
            )
        for session in sessions:
            if _store_pending(parts, session) is not None:
                redacted.add(session.namespace)
        records = [store.sessions.get(s.namespace, s.session_id) for s in sessions]
    for namespace in sorted(redacted):
        redaction_apply.drop_indexes(parts.indexes, namespace)
    return records


def store_sessions(
    parts: Components,
    sessions: Sequence[Session],
    curate: bool,
    report: IngestReport,
    on_progress: ProgressCallback | None,
) -> dict[tuple[str, str], list[int]]:
    """Store the sessions not stored yet (curated, or queued); returns the memory ids stored
    per (namespace, session id)."""
    store = parts.store
    new = [s for s in sessions if not store.sessions.exists(s.namespace, s.session_id)]
    report.skipped += len(sessions) - len(new)
    curate_now = curate and parts.config.curation.mode == "sync"
    if curate_now and not any(redaction_apply.requests_in(parts.config, s) for s in new):
        stored = _curate_and_store(parts, new, already_stored=False, report=report, on_progress=on_progress)
    else:
        # A forget request may name any earlier turn, this call's included: the sessions are
        # stored first, in order, each redacted as it is stored, and curated as stored, so
        # neither the windows nor the LLM see what was asked to be forgotten.
        raw = _store_raw(parts, new, report)
        if not curate_now:
            return {}
        as_stored = [store.sessions.get(s.namespace, s.session_id).session for s in raw]
        stored = _curate_and_store(parts, as_stored, already_stored=True, report=report, on_progress=on_progress)
    report.consolidation_runs = _scheduled_consolidation(parts, {s.namespace for s in new})
    return stored


def sessions_to_curate(
    parts: Components, namespace: str | None, retry_failed: bool, limit: int | None
) -> list[Session]:
    """Sessions stored raw (``pending``; ``curation_failed`` too with ``retry_failed``), oldest
    first, of one namespace or all; at most ``limit``."""
    statuses = ["pending"] + (["curation_failed"] if retry_failed else [])
    return [r.session for r in parts.store.sessions.to_curate(statuses, namespace=namespace, limit=limit)]


def mark_curation_failed(parts: Components, sessions: Sequence[Session], error: str) -> int:
    """Mark those of ``sessions`` still pending ``curation_failed``; returns how many were marked."""
    marked = 0
    for session in sessions:
        try:
            if parts.store.sessions.get(session.namespace, session.session_id).curation_status != "pending":
                continue  # stored before the error, or curated by another process
            parts.store.sessions.set_curation_status(
                session.namespace, session.session_id, "curation_failed", error, require_uncurated=True
            )
            marked += 1
        except (AlreadyCuratedError, NotFoundError):  # curated meanwhile, or its namespace forgotten
            continue
    return marked


def curate_stored(parts: Components, sessions: Sequence[Session], on_progress: ProgressCallback | None) -> IngestReport:
    """Curate sessions already stored (pending or failed) in batches, then run the consolidation
    their namespaces are due; a session curated meanwhile by another process is skipped."""
    report = IngestReport()
    _curate_and_store(parts, sessions, already_stored=True, report=report, on_progress=on_progress)
    report.consolidation_runs = _scheduled_consolidation(parts, {s.namespace for s in sessions})
    return report


def _store_raw(parts: Components, sessions: Sequence[Session], report: IngestReport) -> list[Session]:
    """Store sessions raw as ``pending``, each in its own transaction with the redaction its
    forget requests make; returns those stored here (another process may have stored one since
    they were checked)."""
    stored: list[Session] = []
    redacted: set[str] = set()
    for session in sessions:
        try:
            if _store_pending(parts, session) is not None:
                redacted.add(session.namespace)
        except DuplicateSessionError:  # another process stored it since the check in store_sessions
            report.skipped += 1
            continue
        report.stored += 1
        stored.append(session)
    for namespace in sorted(redacted):
        redaction_apply.drop_indexes(parts.indexes, namespace)
    return stored


def _store_pending(parts: Components, session: Session) -> int | None:
    """Store a session raw as ``pending`` and redact what its forget requests name, in one
    transaction (the caller's, when inside one); returns the redaction's id, if one was made.
    The caller rebuilds the namespace's indexes after its transaction."""
    with parts.store.transaction():
        parts.store.sessions.insert(session, curation_status="pending")
        return redaction_apply.redact_as_stored(parts.writer, parts.config, session)


def _curate_and_store(
    parts: Components,
    sessions: Sequence[Session],
    already_stored: bool,
    report: IngestReport,
    on_progress: ProgressCallback | None,
) -> dict[tuple[str, str], list[int]]:
    config = parts.config
    curator = Curator(parts.llm, config.llm, config.curation, embed=parts.embedder.embed)
    batch = config.curation.batch_sessions
    stored: dict[tuple[str, str], list[int]] = {}
    for start in range(0, len(sessions), batch):
        chunk = sessions[start : start + batch]
        for session, outcome in zip(chunk, curator.curate(chunk), strict=True):
            report.usage.add(outcome.usage)
            report.memories_left_out += len(outcome.dropped_memories)
            report.memories_aligned += outcome.aligned_memories
            try:
                stored[(session.namespace, session.session_id)] = _store_outcome(
                    parts, session, outcome, already_stored, report
                )
            except DuplicateSessionError:  # another process stored it meanwhile
                report.skipped += 1
                continue
            redaction_apply.redact_curated(parts.writer, config, session, outcome.forget_requests)
        if on_progress is not None:
            on_progress(min(start + batch, len(sessions)), len(sessions))
    redaction_apply.confirm_expired(parts.indexes, config)
    return stored


def _store_outcome(
    parts: Components, session: Session, outcome: CurationOutcome, already_stored: bool, report: IngestReport
) -> list[int]:
    """Write one session's curation: its memories (their ids are returned), or the failure
    status (never losing the turns)."""
    ids: list[int] = []
    if outcome.ok and outcome.result is not None:
        held, duplicates = write_memories(
            parts,
            session.namespace,
            [*outcome.result.episodes, *outcome.result.tuples],
            session=None if already_stored else session,
            source_session_id=session.session_id,
            prompt_version=outcome.prompt_version,
            require_uncurated=already_stored,
            deduplicate=True,
        )
        ids = list(dict.fromkeys(held))
        report.memories += len(held) - duplicates
        report.duplicates_skipped += duplicates
        report.curated += 1
    else:
        log.warning("curation of session %s failed: %s", session.session_id, outcome.error)
        if already_stored:
            parts.store.sessions.set_curation_status(
                session.namespace, session.session_id, "curation_failed", outcome.error, require_uncurated=True
            )
        else:
            parts.store.sessions.insert(session, curation_status="curation_failed", curation_error=outcome.error)
        report.failed += 1
    report.stored += 0 if already_stored else 1
    return ids


def _scheduled_consolidation(parts: Components, namespaces: set[str]) -> list[int]:
    if parts.config.consolidation.every_n_sessions == 0:
        return []
    runs = []
    for namespace in sorted(namespaces):
        report = consolidate_if_due(parts, namespace)
        if report is not None and report.run_id is not None:
            runs.append(report.run_id)
    return runs
