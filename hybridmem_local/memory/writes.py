"""Writes of memories: given ones (``add_memories``), curated ones (with their session), an
update as a new row that supersedes the old one, a soft delete. Each goes through the write unit
(``indexes/writer.py``): embedded before its one transaction, the new vectors cached inside it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from hybridmem_local.curation import redaction_apply
from hybridmem_local.curation.dedup import fold_repeats, plan_duplicates
from hybridmem_local.errors import InvalidInputError
from hybridmem_local.memory.components import Components
from hybridmem_local.memory.reads import get
from hybridmem_local.schema import (
    Episode,
    EpisodeDraft,
    MemoryStatus,
    RelationalTuple,
    Session,
    TupleDraft,
    check_namespace,
)


def write_memories(
    parts: Components,
    namespace: str,
    memories: Sequence[EpisodeDraft | TupleDraft],
    session: Session | None = None,
    source_session_id: str | None = None,
    prompt_version: str | None = None,
    require_uncurated: bool = False,
    deduplicate: bool = False,
) -> tuple[list[int], int]:
    """``add_memories``; with ``deduplicate`` (curated writes), a memory repeating an active one
    is not stored and its turns go to that row (curation/dedup.py). Returns, per memory, the id of the
    row holding it, and how many were repeats."""
    store = parts.store
    check_namespace(namespace)
    if session is not None and session.namespace != namespace:
        raise InvalidInputError(
            f"session {session.session_id!r} belongs to namespace {session.namespace!r}, not {namespace!r}"
        )
    check_provenance(parts, namespace, memories, session)
    embedded = parts.writer.embed(namespace, [as_stored(m, namespace).index_text() for m in memories])
    source_session_id = session.session_id if session is not None else source_session_id
    plan = None
    if deduplicate:
        plan = plan_duplicates(
            memories,
            list(embedded.vectors),
            candidates=lambda kind, timestamp: store.memories.duplicate_candidates(
                namespace, kind, timestamp, source_session_id
            ),
            vectors_of=lambda stored_texts: parts.indexes.embed(namespace, stored_texts),
            threshold=parts.config.curation.duplicate_cosine,
            same_session=source_session_id is not None,
        )
    with parts.writer.transaction(embedded):
        if session is not None:
            store.sessions.insert(session, curation_status="curated", prompt_version=prompt_version)
        elif source_session_id is not None:
            store.sessions.set_curation_status(
                namespace,
                source_session_id,
                "curated",
                prompt_version=prompt_version,
                require_uncurated=require_uncurated,
            )
        ids = store.memories.insert(namespace, plan.new if plan else memories, source_session_id=source_session_id)
        if plan is not None:
            ids = fold_repeats(store, plan, ids)
        # After the memories: a forget request in the session names what they hold too.
        redaction = (
            redaction_apply.redact_as_stored(parts.writer, parts.config, session) if session is not None else None
        )
    if redaction is not None:
        redaction_apply.drop_indexes(parts.indexes, namespace)
    return ids, len(plan.repeats) if plan else 0


def check_provenance(
    parts: Components, namespace: str, memories: Sequence[EpisodeDraft | TupleDraft], session: Session | None
) -> None:
    """Every cited turn must be one of ``session``'s or a stored turn of the namespace (InvalidInputError)."""
    cited = {t for m in memories for t in m.source_turn_ids}
    if not cited:
        return
    known = {t.turn_id for t in session.turns} if session is not None else set()
    unknown = cited - known - parts.store.sessions.existing_turn_ids(namespace, sorted(cited - known))
    if unknown:
        raise InvalidInputError(
            f"source_turn_ids name turns that namespace {namespace!r} does not have: {sorted(unknown)[:5]}"
        )


def update(parts: Components, memory_id: int, reason: str, fields: dict[str, Any]) -> Episode | RelationalTuple:
    """The changed record stored as the active memory that supersedes ``memory_id`` (``HybridMemory.update``)."""
    old = get(parts, memory_id)
    if old.status != MemoryStatus.active:
        hint = f"; update its successor {old.superseded_by}" if old.superseded_by is not None else ""
        raise InvalidInputError(f"memory {memory_id} is {old.status.value}, only an active memory can be updated{hint}")
    draft_type = EpisodeDraft if old.kind == "episode" else TupleDraft
    current = draft_type.model_validate(old.model_dump(include=set(draft_type.model_fields)))
    try:
        # Turns a caller gives are cited by that caller: provenance follows them, not the old row.
        kept = current.model_dump(exclude={"provenance"} if "source_turn_ids" in fields else set())
        draft = draft_type.model_validate({**kept, **fields})
    except ValidationError as exc:
        raise InvalidInputError(f"update of memory {memory_id}: {exc}") from exc
    if draft == current:
        return old
    check_provenance(parts, old.namespace, [draft], None)
    new = as_stored(draft, old.namespace).model_copy(update={"source_session_id": old.source_session_id})
    with parts.writer.transaction(parts.writer.embed(old.namespace, [new.index_text()])):
        new_id = parts.store.memories.supersede(old.namespace, [memory_id], new, reason=reason, action="update")
    return get(parts, new_id)


def delete(parts: Components, memory_id: int, reason: str, namespace: str | None) -> None:
    """Mark a memory deleted (kept in history); a deleted one stays as it is."""
    memory = get(parts, memory_id, namespace=namespace)
    if memory.status == MemoryStatus.deleted:
        return
    parts.store.memories.set_status(memory_id, MemoryStatus.deleted, reason=reason)


def as_stored(memory: EpisodeDraft | TupleDraft, namespace: str) -> Episode | RelationalTuple:
    """A draft as the memory it is stored as in ``namespace`` (a stored memory as it is)."""
    if isinstance(memory, (Episode, RelationalTuple)):
        return memory
    cls = Episode if isinstance(memory, EpisodeDraft) else RelationalTuple
    return cls(namespace=namespace, **memory.model_dump())
