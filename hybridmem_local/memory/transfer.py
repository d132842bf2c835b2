"""Export and import: a namespace as JSONL with provenance, to move it between machines."""

from __future__ import annotations

import json
from pathlib import Path

from hybridmem_local.errors import NotFoundError
from hybridmem_local.files.paths import owner_only_opener
from hybridmem_local.files.session_files import export_bytes, read_export
from hybridmem_local.memory.components import Components
from hybridmem_local.schema import MemoryStatus, check_namespace


def export(parts: Components, namespace: str, path: Path) -> int:
    """Write the namespace's export to ``path`` (sealed with the store's file key when the store
    is encrypted) and record it, so ``forget`` removes it; returns the records written."""
    store = parts.store
    records = export_records(parts, namespace)
    data = export_bytes(records, None if store.keys is None else store.keys.files)
    with open(path, "wb", opener=owner_only_opener) as out:
        out.write(data)
    store.namespaces.record_export(namespace, path)
    return len(records)


def export_records(parts: Components, namespace: str) -> list[str]:
    """The export's JSONL lines, each ending in a newline: sessions, then memories of any status."""
    store = parts.store
    check_namespace(namespace)
    if namespace not in store.namespaces.names():
        raise NotFoundError(f"namespace {namespace!r} does not exist")
    sessions = [
        json.dumps({"type": "session", **json.loads(record.model_dump_json())}) + "\n"
        for record in store.sessions.select(namespace)
    ]
    memories = [
        json.dumps({"type": "memory", **json.loads(memory.model_dump_json())}) + "\n"
        for memory in store.memories.select(namespace, status=None)
    ]
    return sessions + memories


def import_(parts: Components, path: Path, namespace: str | None) -> dict[str, int]:
    """Load an export (optionally into another namespace) in one transaction; the active
    memories' vectors are cached in it."""
    store = parts.store
    key = None if store.keys is None else store.keys.files
    sessions, memories = read_export(path, namespace, key)
    target = {m.namespace for m in memories} | {s.session.namespace for s in sessions}
    old_to_new: dict[int, int] = {}
    with store.transaction():
        for record in sessions:
            store.sessions.insert(record.session, curation_status=record.curation_status)
        for memory in memories:
            (new_id,) = store.memories.insert(memory.namespace, [memory], action="import")
            old_to_new[memory.stored_id] = new_id
        for memory in memories:
            if memory.status != MemoryStatus.active:
                store.memories.set_status(
                    old_to_new[memory.stored_id],
                    memory.status,
                    reason="imported",
                    superseded_by=None if memory.superseded_by is None else old_to_new.get(memory.superseded_by),
                    action="import",
                )
        for ns in target:
            parts.indexes.embed(
                ns, [m.index_text() for m in memories if m.namespace == ns and m.status == MemoryStatus.active]
            )
    return {"sessions": len(sessions), "memories": len(memories)}
