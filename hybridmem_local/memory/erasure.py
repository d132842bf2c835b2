"""Erasing a namespace (``forget``): its rows, history, vectors, index files, exports and LLM
cache entries, then a scrub of the store and the cache file so no file keeps a byte of it
(docs/deployment.md, "Forget"); and finishing the scrubs a reader held up."""

from __future__ import annotations

import logging

from hybridmem_local.llm.cache import forget_tag, retry_pending_scrub
from hybridmem_local.memory.components import Components
from hybridmem_local.schema import check_namespace
from hybridmem_local.storage.paths import llm_cache_path
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
    if counts["scrub_pending"]:
        log.warning(
            "forget %r: the rows are deleted, but %d file(s) keep them in their WAL until another connection's "
            "read ends; the scrub is retried when the service is idle and at the next open",
            namespace,
            counts["scrub_pending"],
        )
    return counts


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
