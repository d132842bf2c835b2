"""Erasing a namespace (``forget``): its rows, history, vectors, index files, exports and LLM
cache entries, then a scrub of the store and the cache file so no file keeps a byte of it
(docs/deployment.md, "Forget"); and finishing the scrubs a reader held up."""

from __future__ import annotations

import logging

from hybridmem_local.files.paths import owner_only_opener
from hybridmem_local.llm.cache import forget_tag, retry_pending_scrub
from hybridmem_local.memory.components import Components
from hybridmem_local.schema import check_namespace
from hybridmem_local.storage.paths import forgotten_seen_path, llm_cache_path
from hybridmem_local.storage.scrub import is_pending

log = logging.getLogger(__name__)


def forget(parts: Components, namespace: str) -> dict[str, int]:
    """Remove every trace of a namespace; returns what went, per table and file, with
    ``scrub_pending``: the files whose scrub another connection's read held up (0: none)."""
    store = parts.store
    check_namespace(namespace)
    exports = store.namespaces.exports(namespace)
    counts = store.forget_namespace(namespace)
    parts.indexes.forget(namespace)
    for path in exports:
        path.unlink(missing_ok=True)
    counts["exports"] = len(exports)
    if store.path is not None:
        forgotten = forget_tag(
            llm_cache_path(store.path), namespace, store.keys, parts.config.store.busy_timeout_ms / 1000
        )
        counts["llm_cache"] = forgotten.deleted
        counts["scrub_pending"] += int(not forgotten.scrubbed)
    sweep_forgotten(parts)  # this process's own tombstone: its copies are gone already; mark it seen
    if counts["scrub_pending"]:
        log.warning(
            "forget %r: the rows are deleted, but %d file(s) keep them in their WAL until another connection's "
            "read ends; the scrub is retried when the service is idle and at the next open",
            namespace,
            counts["scrub_pending"],
        )
    return counts


def sweep_forgotten(parts: Components) -> list[str]:
    """Remove this process's own copies of the namespaces forgotten since it last looked, by it
    or by any other process on the store (a replica, a worker, the CLI): their index folders,
    LLM cache entries and the export files at the recorded paths that exist on this host. The
    last tombstone seen is kept beside the local files, so a restart does not sweep again.
    Returns the namespaces swept."""
    store = parts.store
    if store.path is None:
        return []  # in memory: no local file, no other process
    seen_file = forgotten_seen_path(store.path)
    seen = int(seen_file.read_text() or 0) if seen_file.exists() else 0
    tombstones = store.forgotten(seen)
    for _, namespace, exports in tombstones:
        parts.indexes.forget(namespace)
        for path in exports:
            path.unlink(missing_ok=True)
        forget_tag(llm_cache_path(store.path), namespace, store.keys, parts.config.store.busy_timeout_ms / 1000)
    if tombstones:
        with open(seen_file, "w", opener=owner_only_opener) as out:
            out.write(str(tombstones[-1][0]))
    return [namespace for _, namespace, _ in tombstones]


def scrub_pending(parts: Components) -> bool:
    """Whether a forget, purge or confirmed redaction left the scrub of the store or its LLM call
    cache pending (a reader held it up)."""
    store = parts.store
    return store.path is not None and (store.scrub_pending or is_pending(llm_cache_path(store.path)))


def retry_pending_scrubs(parts: Components) -> int:
    """Finish the scrubs a forget or purge left pending (store and LLM cache), without waiting
    for readers; returns how many files are still pending (0: none)."""
    store = parts.store
    result = store.retry_pending_scrub()
    pending = int(result is not None and not result.done)
    if store.path is not None:
        pending += int(retry_pending_scrub(llm_cache_path(store.path), store.keys) is False)
    return pending
