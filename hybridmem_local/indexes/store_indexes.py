"""The index layer: every rebuildable cache of one store, kept in step with it in one way.

For each namespace and source (``episode``, ``tuple``, ``window``) there is an hnswlib index
(``vectors.py``) and a BM25 index (``bm25.py``); windows themselves (``windows.py``) are
derived from the stored turns. All of them live beside the store in
``<store>.indexes/<namespace>/`` and save through ``files.paths.GenerationFiles``.

How they stay in step with SQLite, whichever process wrote:

* one change marker, ``MemoryStore.change_marker()`` (``PRAGMA data_version`` for other
  processes' commits, the last event id for this process's own: every memory write and every
  stored session logs an event), is read on every index use;
* an index used for the first time, or again after the marker moved, is caught up: its ids are
  compared with the ids SQLite holds (active memories, or the windows of the stored turns)
  and only the difference is added or removed; an index whose files are missing, damaged or
  built for another model or recipe is rebuilt;
* vectors come from the store's embedding cache (``embed``); only texts missing from it are
  embedded, and cached.

``rebuild`` throws a namespace's index files away; ``forget`` removes them with the folder.
When the store is encrypted every index file that holds content is sealed with the store's
file key (``GenerationFiles``); a file that fails to unseal is rebuilt from the store.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import sqlalchemy as sa

from hybridmem_local.config import Config
from hybridmem_local.embedding import Embedder
from hybridmem_local.errors import StoreError
from hybridmem_local.indexes.bm25 import LexicalIndex, bm25_document
from hybridmem_local.indexes.vectors import SyncReport, VectorIndex
from hybridmem_local.indexes.windows import WINDOW_KIND, WindowSet
from hybridmem_local.schema import EvidenceWindow, MemoryKind
from hybridmem_local.storage.embedding_cache import text_hash
from hybridmem_local.storage.paths import indexes_path
from hybridmem_local.storage.store import MemoryStore

log = logging.getLogger(__name__)

#: What an index holds: one of the memory stores, or the raw-turn evidence windows.
SourceKind = Literal["episode", "tuple", "window"]
MEMORY_KINDS: tuple[MemoryKind, ...] = ("episode", "tuple")
SOURCE_KINDS: tuple[SourceKind, ...] = (*MEMORY_KINDS, WINDOW_KIND)

#: Changing what ``bm25.bm25_document`` returns must change this, so old BM25 indexes rebuild.
MEMORY_RECIPE = "memory-v1: episode title+summary+details; tuple render()"

Marker = tuple[int, int]


class StoreIndexes:
    """The vector and BM25 indexes and the evidence windows of one store, caught up on use."""

    def __init__(self, store: MemoryStore, config: Config, embedder: Callable[[], Embedder]):
        self.store = store
        self.config = config
        self._embedder = embedder
        #: Seals the index files of an encrypted store (None: plaintext files, as always).
        self._file_key = store.keys.files if store.keys is not None else None
        self._dense: dict[tuple[str, SourceKind], VectorIndex] = {}
        self._lexical: dict[tuple[str, SourceKind], LexicalIndex] = {}
        self._windows: dict[str, WindowSet] = {}
        #: The change marker each namespace's window set was last refreshed at.
        self._windows_at: dict[str, Marker] = {}
        #: The change marker each loaded index was last caught up at.
        self._synced_at: dict[tuple[str, str, SourceKind], Marker] = {}
        #: Called once whenever an index use finds the change marker moved (any process's commit).
        self.on_store_change: list[Callable[[], object]] = []
        self._noticed_at: Marker | None = None

    # ------------------------------------------------------------------ files

    def directory(self, namespace: str) -> Path:
        if self.store.path is None:
            raise StoreError("an in-memory store has no index directory")
        return indexes_path(self.store.path) / namespace

    # ------------------------------------------------------------------ embeddings

    def embed(self, namespace: str, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts`` (one row each, in order): from the embedding cache, embedding and
        caching only the texts missing from it."""
        embedder = self._embedder()
        if not texts:
            return np.zeros((0, embedder.dimension), dtype=np.float32)
        cached = self.store.embedding_cache.get(namespace, embedder.model_id, texts)
        missing = sorted({t for t in texts if text_hash(t) not in cached})
        if missing:
            vectors = embedder.embed(missing)
            self._cache_embeddings(namespace, embedder.model_id, missing, vectors)
            cached.update({text_hash(t): v for t, v in zip(missing, vectors, strict=True)})
        return np.stack([cached[text_hash(t)] for t in texts])

    def _cache_embeddings(self, namespace: str, model_id: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Store vectors in the embedding cache. Outside a write, a store that cannot take them
        (full, read-only) only logs it: the cache saves re-embedding, and a search must not fail
        for it (a write's own transaction still fails as a whole)."""
        inside_write = self.store.in_transaction
        try:
            self.store.embedding_cache.put(namespace, model_id, texts, vectors)
        except sa.exc.OperationalError as exc:
            if inside_write:
                raise
            log.warning("embedding cache not written (%s): %d texts will be embedded again next time", exc, len(texts))

    def for_write(self, namespace: str, texts: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """What a writer needs of ``texts``: those the embedding cache lacks, their vectors (not
        yet stored), and the vectors of all ``texts`` in order. A writer embeds before its
        transaction (a failure there changes nothing) and stores the missing ones in it."""
        embedder = self._embedder()
        cached = self.store.embedding_cache.get(namespace, embedder.model_id, texts)
        missing = sorted({t for t in texts if text_hash(t) not in cached})
        empty = np.zeros((0, embedder.dimension), dtype=np.float32)
        vectors = embedder.embed(missing) if missing else empty
        cached.update({text_hash(t): v for t, v in zip(missing, vectors, strict=True)})
        return missing, vectors, np.stack([cached[text_hash(t)] for t in texts]) if texts else empty

    def embed_query(self, text: str) -> np.ndarray:
        return self._embedder().embed([text])[0]

    # ------------------------------------------------------------------ indexes, caught up

    def dense(self, namespace: str, kind: SourceKind) -> VectorIndex:
        """The namespace's hnswlib index of ``kind``, caught up with the store."""
        self._notice(self.store.change_marker())  # before any index object is taken
        key = (namespace, kind)
        embedder = self._embedder()
        if kind == WINDOW_KIND:
            windows = self._window_set(namespace)
            # The manifest's model id also names the window shape: vectors of other windows are rebuilt.
            model_id = f"{embedder.model_id}|{windows.recipe}"
            window_index = self._dense.get(key)
            if window_index is None or window_index.model_id != model_id:
                window_index = self._dense[key] = VectorIndex(
                    self.directory(namespace), kind, model_id, embedder.dimension, self.config.index, self._file_key
                )
                self._synced_at.pop(("dense", *key), None)
            self._catch_up(
                ("dense", *key),
                window_index,
                lambda: window_index.sync(windows.ids(), lambda ids: self.embed(namespace, windows.texts(ids))),
                before=lambda: self._refresh_windows(namespace),
            )
            return window_index
        index = self._dense.get(key)
        if index is None:
            index = self._dense[key] = VectorIndex(
                self.directory(namespace),
                kind,
                embedder.model_id,
                embedder.dimension,
                self.config.index,
                self._file_key,
            )
        self._catch_up(
            ("dense", *key),
            index,
            lambda: index.sync(
                self.store.memories.active_ids(namespace, kind), lambda ids: self._memory_vectors(namespace, ids)
            ),
        )
        return index

    def lexical(self, namespace: str, kind: SourceKind) -> LexicalIndex:
        """The namespace's BM25 index of ``kind``, caught up with the store."""
        self._notice(self.store.change_marker())  # before any index object is taken
        key = (namespace, kind)
        if kind == WINDOW_KIND:
            windows = self._window_set(namespace)
            window_index = self._lexical.get(key)
            if window_index is None or window_index.recipe != windows.recipe:
                window_index = self._lexical[key] = LexicalIndex(
                    self.directory(namespace), kind, windows.recipe, self._file_key
                )
                self._synced_at.pop(("lexical", *key), None)
            self._catch_up(
                ("lexical", *key),
                window_index,
                lambda: window_index.sync(windows.ids(), windows.texts),
                before=lambda: self._refresh_windows(namespace),
            )
            return window_index
        index = self._lexical.get(key)
        if index is None:
            index = self._lexical[key] = LexicalIndex(self.directory(namespace), kind, MEMORY_RECIPE, self._file_key)
        self._catch_up(
            ("lexical", *key),
            index,
            lambda: index.sync(self.store.memories.active_ids(namespace, kind), lambda ids: self._memory_texts(ids)),
        )
        return index

    def windows(self, namespace: str, ids: Sequence[int]) -> dict[int, EvidenceWindow]:
        """Windows by id (those the namespace has), in the configured shape."""
        return self._refresh_windows(namespace).get(ids)

    def all_windows(self, namespace: str) -> list[EvidenceWindow]:
        return list(self._refresh_windows(namespace).windows.values())

    def _refresh_windows(self, namespace: str) -> WindowSet:
        """The namespace's window set, reloaded if its turns changed. Every insert of turns moves
        the change marker, so the turns are checked only when it moved: their check counts the
        namespace's turns (~10 ms at 100k), too slow for every search."""
        marker = self.store.change_marker()  # read first, as in _catch_up
        self._notice(marker)
        windows = self._window_set(namespace)
        if self._windows_at.get(namespace) != marker:
            windows.refresh()
            self._windows_at[namespace] = marker
        return windows

    def _window_set(self, namespace: str) -> WindowSet:
        size, stride = self.config.retrieval.window_size, self.config.retrieval.window_stride
        windows = self._windows.get(namespace)
        if windows is None or (windows.size, windows.stride) != (size, stride):
            windows = self._windows[namespace] = WindowSet(self.store, namespace, size, stride)
            self._windows_at.pop(namespace, None)
        return windows

    def _catch_up(
        self,
        key: tuple[str, str, SourceKind],
        index: VectorIndex | LexicalIndex,
        sync: Callable[[], SyncReport],
        before: Callable[[], object] | None = None,
    ) -> None:
        # Read before syncing: a commit landing during the sync moves the marker again, so the
        # next use catches up once more instead of missing it.
        marker = self.store.change_marker()
        if self._synced_at.get(key) == marker:
            return
        first = key not in self._synced_at
        if before is not None:
            before()
        report = sync()
        self._synced_at[key] = marker
        # Built from nothing and still empty (a namespace the store does not hold, or one another
        # process forgot): nothing to keep, and no folder named after it comes back to disk.
        built_empty = report.rebuilt and not report.removed and len(index) == 0
        if first and (report.rebuilt or report.added or report.removed) and not built_empty:
            index.save()  # the next process loads it as caught up here

    def _notice(self, marker: Marker) -> None:
        """Run the ``on_store_change`` callbacks once per move of the store's change marker (e.g.
        the sweep of namespaces another process forgot: ``memory/erasure.py``). Called before an
        index object is taken, so a callback that drops indexes never pulls one from under a use."""
        if marker == self._noticed_at:
            return
        self._noticed_at = marker
        for callback in self.on_store_change:
            callback()

    def _memory_vectors(self, namespace: str, ids: np.ndarray) -> np.ndarray:
        rows = self.store.memories.get_many([int(i) for i in ids])
        return self.embed(namespace, [rows[int(i)].index_text() for i in ids])

    def _memory_texts(self, ids: np.ndarray) -> list[str]:
        rows = self.store.memories.get_many([int(i) for i in ids])
        return [bm25_document(rows[int(i)]) for i in ids]

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Persist every changed index (they are a cache: losing them only costs a rebuild).

        Indexes of a namespace forgotten meanwhile (by another connection) are dropped, not
        saved: they would bring the forgotten vectors and words back to disk."""
        existing = set(self.store.namespaces.names())
        for namespace in {ns for ns, _ in [*self._dense, *self._lexical]} - existing:
            for kind in SOURCE_KINDS:
                self._dense.pop((namespace, kind), None)
                self._lexical.pop((namespace, kind), None)
        indexes: list[VectorIndex | LexicalIndex] = [*self._dense.values(), *self._lexical.values()]
        for index in indexes:
            index.save()

    def rebuild(self, namespace: str) -> dict[str, SyncReport]:
        """Throw the namespace's index files away and build its memories' vector indexes again
        from the store (BM25 and window indexes are built again on their next use)."""
        self.drop(namespace)
        reports: dict[str, SyncReport] = {}
        embedder = self._embedder()
        for kind in MEMORY_KINDS:
            index = self._dense[(namespace, kind)] = VectorIndex(
                self.directory(namespace),
                kind,
                embedder.model_id,
                embedder.dimension,
                self.config.index,
                self._file_key,
            )
            marker = self.store.change_marker()
            reports[kind] = index.sync(
                self.store.memories.active_ids(namespace, kind), lambda ids: self._memory_vectors(namespace, ids)
            )
            self._synced_at[("dense", namespace, kind)] = marker
            index.save()
        return reports

    def drop(self, namespace: str) -> None:
        """Unload the namespace's indexes and delete their files (the folder stays)."""
        self._windows.pop(namespace, None)
        self._windows_at.pop(namespace, None)
        for key in [k for k in self._synced_at if k[1] == namespace]:
            del self._synced_at[key]
        directory = self.directory(namespace)
        for kind in SOURCE_KINDS:
            dense = self._dense.pop((namespace, kind), None) or VectorIndex(directory, kind, "", 0, self.config.index)
            lexical = self._lexical.pop((namespace, kind), None) or LexicalIndex(directory, kind)
            dense.delete_files()
            lexical.delete_files()

    def forget(self, namespace: str) -> None:
        """Remove every index file of the namespace, and its folder."""
        if self.store.path is None:
            return
        self.drop(namespace)
        directory = self.directory(namespace)
        if directory.exists():
            shutil.rmtree(directory)

    def sizes(self) -> dict[str, int]:
        """``namespace/kind`` → memories (or windows) in each loaded vector index."""
        return {f"{ns}/{kind}": len(index) for (ns, kind), index in self._dense.items()}
