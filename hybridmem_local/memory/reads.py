"""Reads of stored rows: a memory, a page of memories, a memory's history, the store's figures."""

from __future__ import annotations

from datetime import date, datetime

from hybridmem_local.errors import NotFoundError
from hybridmem_local.memory.components import Components
from hybridmem_local.results import Event, Stats
from hybridmem_local.schema import Episode, MemoryKind, MemoryStatus, RelationalTuple, check_page


def get(parts: Components, memory_id: int, namespace: str | None = None) -> Episode | RelationalTuple:
    """The memory with this id; with ``namespace``, only if it is that namespace's. Either way a
    missing one is a NotFoundError, and another namespace's is reported just as missing."""
    if namespace is None:
        return parts.store.memories.get(memory_id)
    try:
        found = parts.store.memories.get(memory_id)
    except NotFoundError:
        found = None
    if found is None or found.namespace != namespace:
        raise NotFoundError(f"no memory with id {memory_id} in namespace {namespace!r}")
    return found


def page(
    parts: Components,
    namespace: str,
    kind: MemoryKind | None,
    status: MemoryStatus | None,
    limit: int | None,
    offset: int,
    since: date | datetime | None = None,
    until: date | datetime | None = None,
) -> list[Episode | RelationalTuple]:
    """Memories in id order (``status=None``: any status); ``limit``/``offset`` page through them;
    ``since``/``until`` keep those whose timestamp overlaps the period (``Memories.select``)."""
    check_page(limit, offset)
    return parts.store.memories.select(namespace, kind, status, limit=limit, offset=offset, since=since, until=until)


def history(parts: Components, memory_id: int, namespace: str | None) -> list[Event]:
    """Every change of a memory, oldest first (``namespace`` as in :func:`get`)."""
    get(parts, memory_id, namespace=namespace)  # a clear NotFoundError for an unknown id
    return parts.store.events.history(memory_id)


def stats(parts: Components, namespace: str | None) -> Stats:
    """Counts of sessions, turns and memories by status, and the loaded indexes' sizes: of the
    whole store, or of one namespace."""
    namespaces = parts.store.namespaces.names()
    sizes = parts.indexes.sizes()
    if namespace is not None:
        namespaces = [ns for ns in namespaces if ns == namespace]
        sizes = {name: n for name, n in sizes.items() if name.split("/", 1)[0] == namespace}
    return Stats(namespaces=namespaces, counts=parts.store.counts(namespace), index_sizes=sizes)
