"""Redactions on the store: apply what ``redaction.py`` plans, undo it, confirm it.

    redaction_id = redact_as_stored(writer, config, session)   # inside the session's transaction
    redaction_id = redact_curated(writer, config, session, outcome.forget_requests)
    undo(indexes, redaction_id)                                 # exactly as before, while pending
    confirm(indexes, redaction_id)                              # final: originals dropped, store scrubbed

A redaction rewrites the turns in place (their old texts kept in its ``originals`` until it is
confirmed), stores a redacted copy of each memory holding a removed value as the successor of the
original (the store's ``supersede``, through the write unit of ``indexes/writer.py``), and marks
memories about a removed topic deleted; a ``redact`` event records it, without the removed text.
Index files keep the vectors and texts of removed entries, so the namespace's are rebuilt after.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from hybridmem_local.config import Config
from hybridmem_local.curation.redaction import (
    ForgetRequest,
    RedactionPlan,
    TurnText,
    detect_requests,
    merge_requests,
    plan_redaction,
)
from hybridmem_local.errors import ConflictError, NotFoundError
from hybridmem_local.indexes.store_indexes import StoreIndexes
from hybridmem_local.indexes.windows import load_windows
from hybridmem_local.indexes.writer import MemoryWriter
from hybridmem_local.llm.cache import forget_tag
from hybridmem_local.results import Redaction
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryStatus,
    RelationalTuple,
    Session,
    TupleDraft,
    utcnow,
)
from hybridmem_local.storage.embedding_cache import text_hash
from hybridmem_local.storage.paths import llm_cache_path
from hybridmem_local.storage.store import MemoryStore

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- redacting


def requests_in(config: Config, session: Session) -> list[ForgetRequest]:
    """The forget requests the rules find in a session (none with ``curation.forget_requests: off``)."""
    return [] if config.curation.forget_requests == "off" else detect_requests(session)


def redact_as_stored(writer: MemoryWriter, config: Config, session: Session) -> int | None:
    """Redact what the rules' forget requests in ``session`` name, inside the transaction that
    stores it, so neither its windows nor any other ever serve it, whatever the curation backlog.
    A request naming nothing stored leaves no trace: curation plans it again once the session's
    memories exist. Returns the redaction's id, if one was made; the caller rebuilds the
    namespace's indexes after its transaction (:func:`drop_indexes`)."""
    requests = requests_in(config, session)
    if not requests:
        return None
    plan = plan_in_store(writer.store, session.namespace, requests)
    return None if plan.empty else write_redaction(writer, config, session.namespace, session.session_id, plan)


def redact_curated(
    writer: MemoryWriter, config: Config, session: Session, llm_marked: Sequence[ForgetRequest]
) -> int | None:
    """Redact what the session's forget requests name that no redaction of it answered when it
    was stored: the LLM's (``llm_marked``, with ``curation.forget_requests: rules+llm``), and the
    rules' where storing found nothing to remove (or the session was stored without them). An
    empty plan only logs a ``forget_request`` event; otherwise the namespace's indexes are
    rebuilt. Returns the redaction's id, if one was made."""
    mode = config.curation.forget_requests
    if mode == "off":
        return None
    marked = llm_marked if mode == "rules+llm" else []
    # The request sentences stay in the redacted turns, so the rules find them again: a turn
    # already answered is not redacted twice (nor again after an admin undid its redaction).
    answered = writer.store.redactions.asked_turn_ids(session.namespace, session.session_id)
    requests = [r for r in merge_requests(detect_requests(session), marked) if r.turn_id not in answered]
    if not requests:
        return None
    namespace, session_id = session.namespace, session.session_id
    plan = plan_in_store(writer.store, namespace, requests)
    if plan.empty:
        log.info("session %s: forget request(s) named nothing stored", session_id)
        with writer.store.transaction():
            writer.store.events.record(
                namespace,
                "forget_request",
                None,
                None,
                None,
                {"session_id": session_id, "requests": [r.model_dump() for r in plan.requests]},
                "nothing stored matched",
            )
        return None
    redaction_id = write_redaction(writer, config, namespace, session_id, plan)
    drop_indexes(writer.indexes, namespace)
    return redaction_id


def plan_in_store(store: MemoryStore, namespace: str, requests: Sequence[ForgetRequest]) -> RedactionPlan:
    """What ``requests`` name in the namespace's stored turns and memories; changes nothing."""
    turns = [TurnText(r.turn_id, r.session_id, r.speaker, r.text) for r in store.sessions.turn_rows(namespace)]
    return plan_redaction(requests, turns, store.memories.select(namespace, status=None))


def write_redaction(writer: MemoryWriter, config: Config, namespace: str, session_id: str, plan: RedactionPlan) -> int:
    """Apply a non-empty plan as one pending redaction with a ``redact`` event, in one
    transaction (the caller's, when inside one). The removed text stays in the redaction's
    originals until it is confirmed; the caller rebuilds the namespace's indexes after commit."""
    store = writer.store
    olds = store.memories.get_many([*plan.rewritten, *plan.deleted, *plan.retired])
    copies = {old_id: _redacted_copy(olds[old_id], fields, namespace) for old_id, fields in plan.rewritten.items()}
    embedded = writer.embed(namespace, [c.index_text() for c in copies.values()])
    changed_turns = set(plan.turns)
    # Cached vectors of text that is going: removed with the originals on confirm.
    hashes = {text_hash(m.index_text()) for m in olds.values()} | _window_hashes(
        store, config, namespace, changed_turns
    )
    with writer.transaction(embedded):
        before = store.redactions.turn_texts(namespace, sorted(changed_turns))
        redaction_id = store.redactions.create(
            namespace,
            session_id,
            [r.model_dump() for r in plan.requests],
            {},
            {"turns": before, "redacted": plan.turns},
        )
        reason = f"removed at the user's request (redaction {redaction_id})"
        store.redactions.rewrite_turns(namespace, plan.turns)
        rewritten = {
            old_id: store.memories.supersede(namespace, [old_id], copy, reason=reason, action="redact", redacting=True)
            for old_id, copy in copies.items()
        }
        for memory_id in plan.deleted:
            store.memories.set_status(memory_id, MemoryStatus.deleted, reason=reason, action="redact")
        summary = {
            "turn_ids": sorted(changed_turns),
            "rewritten": rewritten,
            "deleted": plan.deleted,
            "retired": plan.retired,
            "spans": sum(len(spans) for spans in plan.spans.values()),
            "embedding_hashes": sorted(hashes),
        }
        store.redactions.set_summary(redaction_id, summary)
        store.events.record(
            namespace,
            "redact",
            None,
            None,
            None,
            {"redaction_id": redaction_id, "session_id": session_id, **{k: summary[k] for k in ("turn_ids", "spans")}},
            "forget request",
        )
    log.info("redaction %d in %s: %d turns, %d memories", redaction_id, namespace, len(changed_turns), len(olds))
    return redaction_id


def _redacted_copy(old: Episode | RelationalTuple, fields: dict[str, str], namespace: str) -> Episode | RelationalTuple:
    """``old`` with the planned fields rewritten, validated as any new memory is."""
    draft_type, stored_type = (EpisodeDraft, Episode) if old.kind == "episode" else (TupleDraft, RelationalTuple)
    draft = draft_type.model_validate({**old.model_dump(include=set(draft_type.model_fields)), **fields})
    return stored_type(namespace=namespace, source_session_id=old.source_session_id, **draft.model_dump())


def _window_hashes(store: MemoryStore, config: Config, namespace: str, turn_ids: set[str]) -> set[str]:
    """Text hashes of the windows that hold any of ``turn_ids``. Read from the store, not the
    indexes' cache of windows: inside a transaction that may still roll back, that cache
    would keep turns that were never stored."""
    if store.path is None:
        return set()
    size, stride = config.retrieval.window_size, config.retrieval.window_stride
    return {
        text_hash(window.index_text())
        for window in load_windows(store, namespace, size, stride).values()
        if turn_ids & {t.turn_id for t in window.turns}
    }


def drop_indexes(indexes: StoreIndexes, namespace: str) -> None:
    """Index files keep vectors and texts of removed entries (hnswlib marks them deleted): rebuild."""
    if indexes.store.path is not None:
        indexes.rebuild(namespace)


# --------------------------------------------------------------------------- review


def redaction_of(store: MemoryStore, redaction_id: int, namespace: str | None) -> Redaction:
    """The redaction with this id; with ``namespace``, only if it is that namespace's (NotFoundError otherwise)."""
    try:
        redaction = store.redactions.get(redaction_id)
    except NotFoundError:
        redaction = None
    if redaction is None or (namespace is not None and redaction.namespace != namespace):
        where = "" if namespace is None else f" in namespace {namespace!r}"
        raise NotFoundError(f"no redaction {redaction_id}{where}")
    return redaction


def undo(indexes: StoreIndexes, redaction_id: int, namespace: str | None = None) -> Redaction:
    """Put back exactly what a pending redaction removed, in one transaction; refused
    (ConflictError, nothing changed) once it is confirmed or undone, or when a turn or memory it
    changed was changed since (a later redaction: undo that first)."""
    store = indexes.store
    redaction = redaction_of(store, redaction_id, namespace)
    originals = _pending_originals(store, redaction)
    ns = redaction.namespace
    current = store.redactions.turn_texts(ns, list(originals["redacted"]))
    moved = [t for t, text in originals["redacted"].items() if current.get(t) != text]
    rows = store.memories.status_rows([*redaction.rewritten, *redaction.rewritten.values(), *redaction.deleted])

    def status(memory_id: int) -> tuple[str | None, int | None]:
        row = rows.get(memory_id, {})
        return row.get("status"), row.get("superseded_by")

    moved += [f"memory {old}" for old, new in redaction.rewritten.items() if status(old) != ("superseded", new)]
    moved += [f"memory {new}" for new in redaction.rewritten.values() if status(new)[0] != "active"]
    moved += [f"memory {m}" for m in redaction.deleted if status(m)[0] != "deleted"]
    if moved:
        raise ConflictError(f"redaction {redaction.id}: changed since: {moved[:5]}; undo the later change first")
    reason = f"undo of redaction {redaction.id}"
    with store.transaction():
        store.redactions.rewrite_turns(ns, originals["turns"])
        for old, new in redaction.rewritten.items():
            store.memories.set_status(new, MemoryStatus.deleted, reason=reason, action="undo_redaction")
            store.memories.set_status(old, MemoryStatus.active, reason=None, action="undo_redaction")
        for memory_id in redaction.deleted:
            store.memories.set_status(memory_id, MemoryStatus.active, reason=None, action="undo_redaction")
        store.redactions.decide(redaction.id, "undone")
        store.events.record(ns, "undo_redaction", None, None, None, {"redaction_id": redaction.id}, None)
    drop_indexes(indexes, ns)
    return store.redactions.get(redaction.id)


def confirm(indexes: StoreIndexes, redaction_id: int, namespace: str | None = None) -> Redaction:
    """Make a pending redaction final: the removed text kept for undo, the memories it retired
    (with their history and cached vectors) and the namespace's LLM call cache are deleted, and
    the store is scrubbed (``MemoryStore.scrub``); it cannot be undone after."""
    store = indexes.store
    redaction = redaction_of(store, redaction_id, namespace)
    _pending_originals(store, redaction)
    ns = redaction.namespace
    summary = store.redactions.summary(redaction.id)
    candidates = sorted({*redaction.rewritten, *redaction.deleted, *redaction.retired})
    # A memory made active again since (by hand) is the admin's: it stays.
    rows = store.memories.status_rows(candidates)
    doomed = [m for m in candidates if m in rows and rows[m]["status"] != MemoryStatus.active.value]
    with store.transaction():
        counts = store.redactions.delete_memories(ns, doomed, summary.get("embedding_hashes", []))
        store.redactions.decide(redaction.id, "confirmed")
        store.events.record(ns, "confirm_redaction", None, None, None, {"redaction_id": redaction.id, **counts}, None)
    if store.path is not None:
        # The cached curation prompts hold the turns as they were.
        forget_tag(llm_cache_path(store.path), ns, store.keys)
    # Freed pages and the WAL would otherwise still hold the removed text; a scrub a reader
    # holds up stays pending and is finished by the worker or the next open (storage/scrub.py).
    store.scrub()
    drop_indexes(indexes, ns)
    return store.redactions.get(redaction.id)


def confirm_expired(indexes: StoreIndexes, config: Config) -> None:
    """Confirm redactions pending longer than ``curation.redaction_review_days``."""
    days = config.curation.redaction_review_days
    if days is None:
        return
    for redaction_id in indexes.store.redactions.pending_before(utcnow() - timedelta(days=days)):
        confirm(indexes, redaction_id)


def _pending_originals(store: MemoryStore, redaction: Redaction) -> dict[str, Any]:
    if redaction.status != "pending":
        raise ConflictError(f"redaction {redaction.id} is {redaction.status} already")
    return store.redactions.originals(redaction.id)
