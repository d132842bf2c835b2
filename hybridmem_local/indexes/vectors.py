"""hnswlib indexes: one per (namespace, store kind), a rebuildable cache of the SQLite rows.

Each index lives in ``<store>.indexes/<namespace>/<kind>.*``: the hnswlib graph, the array of
labels it holds as live, and a small JSON manifest (model id, dimension, count). On open the
index is checked against SQLite's set of active ids and caught up (adds and deletions
replayed) or rebuilt from the cached embeddings; a missing, truncated, stale or foreign index
file is never an error. When the store is encrypted the graph and labels are sealed
(``files.paths.GenerationFiles.write_bytes``): the graph is pickled in memory (hnswlib saves
only to a path) and never written in plaintext; a file that fails to unseal is rebuilt like
any damaged one. Labels are memory ids, so memory content being immutable means a
live label never points at an outdated vector.
"""

from __future__ import annotations

import io
import logging
import pickle
from collections.abc import Callable
from pathlib import Path

import hnswlib
import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.config import IndexConfig
from hybridmem_local.files.paths import GenerationFiles

log = logging.getLogger(__name__)

#: Returns the vectors (one row per id, in order) for the given memory ids.
VectorSource = Callable[[np.ndarray], np.ndarray]


class IndexManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str
    dim: int
    count: int
    #: Names the graph and label files this manifest belongs to.
    generation: str
    format: int = 2


class SyncReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rebuilt: bool = False
    reason: str | None = None
    added: int = 0
    removed: int = 0


class VectorIndex:
    """Cosine-space hnswlib index whose labels are memory ids."""

    def __init__(
        self, directory: Path, kind: str, model_id: str, dim: int, config: IndexConfig, key: bytes | None = None
    ):
        """``key``: the store's file-sealing key when it is encrypted (the files are sealed)."""
        self.directory = directory
        self.kind = kind
        self.model_id = model_id
        self.dim = dim
        self.config = config
        self._index: hnswlib.Index | None = None
        self._live: set[int] = set()
        #: Every label in the graph, live or marked deleted (hnswlib cannot add a label twice).
        self._known: set[int] = set()
        #: Changed since loaded or saved: only then does ``save`` write a new generation.
        self._dirty = False
        self._files = GenerationFiles(
            directory, f"{kind}.manifest.json", f"{kind}.{{}}.", f"{kind}.manifest.{{}}.tmp", "generation", key
        )

    def files(self) -> list[Path]:
        return self._files.files()

    # ------------------------------------------------------------------ lifecycle

    def _empty(self, capacity: int) -> hnswlib.Index:
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.init_index(
            max_elements=max(capacity, self.config.initial_capacity),
            M=self.config.M,
            ef_construction=self.config.ef_construction,
            allow_replace_deleted=False,
        )
        index.set_ef(self.config.ef_search)
        return index

    def _load(self) -> str | None:
        """Load the persisted index; returns why it cannot be used, or None on success."""
        if not self._files.manifest_path.exists():
            return "index files missing"
        try:
            manifest = IndexManifest.model_validate_json(self._files.manifest_path.read_text())
            if manifest.model_id != self.model_id or manifest.dim != self.dim:
                return f"index built with {manifest.model_id} ({manifest.dim}-d), config uses {self.model_id}"
            labels = np.load(io.BytesIO(self._files.read_bytes(manifest.generation, "labels.npy")))
            if len(labels) != manifest.count:
                return "label file does not match manifest"
            index = self._load_graph(manifest)
            index.set_ef(self.config.ef_search)
        except Exception as exc:  # any unreadable file means: rebuild from SQLite
            return f"index unreadable ({type(exc).__name__}: {exc})"
        self._index, self._live = index, set(int(x) for x in labels)
        self._known = set(int(x) for x in index.get_ids_list())
        return None

    def _load_graph(self, manifest: IndexManifest) -> hnswlib.Index:
        if self._files.sealed:
            # Unpickled only after GCM authenticated it: only a holder of the key wrote these bytes.
            index = pickle.loads(self._files.read_bytes(manifest.generation, "hnsw"))
            if not isinstance(index, hnswlib.Index) or (index.space, index.dim) != ("cosine", self.dim):
                raise ValueError(f"the sealed graph is not a cosine hnswlib index of {self.dim} dimensions")
            return index
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.load_index(
            str(self._files.path(manifest.generation, "hnsw")),
            max_elements=max(manifest.count, self.config.initial_capacity),
        )
        return index

    def sync(self, active_ids: np.ndarray, vectors_for: VectorSource) -> SyncReport:
        """Make the index hold exactly ``active_ids``: load, catch up, or rebuild."""
        if self._index is None:
            problem = self._load()
            if problem is not None:
                log.info("rebuilding %s index in %s: %s", self.kind, self.directory, problem)
                self._index, self._live, self._known = self._empty(len(active_ids)), set(), set()
                self._dirty = True  # even an empty index is saved, so the next open loads instead of rebuilding
                report = SyncReport(rebuilt=True, reason=problem)
                self.add(active_ids, vectors_for(active_ids))
                report.added = len(active_ids)
                return report
        wanted = set(int(x) for x in active_ids)
        to_add = np.array(sorted(wanted - self._live), dtype=np.int64)
        to_remove = sorted(self._live - wanted)
        self.remove(to_remove)
        if len(to_add):
            self.add(to_add, vectors_for(to_add))
        return SyncReport(added=len(to_add), removed=len(to_remove))

    def save(self) -> None:
        """Write a new generation of graph + labels and switch the manifest to it (files.GenerationFiles)."""
        if self._index is None or not self._dirty:
            return
        index, live = self._index, np.array(sorted(self._live), dtype=np.int64)

        def write(generation: str) -> None:
            if self._files.sealed:
                self._files.write_bytes(generation, "hnsw", pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL))
            else:
                index.save_index(str(self._files.path(generation, "hnsw")))
            labels = io.BytesIO()
            np.save(labels, live)
            self._files.write_bytes(generation, "labels.npy", labels.getvalue())

        self._files.save(
            write,
            lambda generation: IndexManifest(
                model_id=self.model_id, dim=self.dim, count=len(live), generation=generation
            ),
        )
        self._dirty = False

    def delete_files(self) -> None:
        self._files.delete()
        self._index, self._live, self._known, self._dirty = None, set(), set(), False

    # ------------------------------------------------------------------ updates

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors for new ids; ids that were marked deleted are revived (undo)."""
        assert self._index is not None, "sync() first"
        if len(ids) == 0:
            return
        ids = np.asarray(ids, dtype=np.int64)
        fresh = np.array([i not in self._known for i in ids.tolist()], dtype=bool)
        for label in ids[~fresh].tolist():
            self._index.unmark_deleted(label)
        if fresh.any():
            needed = self._index.get_current_count() + int(fresh.sum())
            if needed > self._index.get_max_elements():
                self._index.resize_index(max(needed, 2 * self._index.get_max_elements()))
            self._index.add_items(
                np.asarray(vectors, dtype=np.float32)[fresh], ids[fresh], num_threads=self.config.build_threads
            )
            self._known.update(int(x) for x in ids[fresh])
        self._live.update(int(x) for x in ids)
        self._dirty = True

    def remove(self, ids) -> None:
        assert self._index is not None, "sync() first"
        for label in ids:
            label = int(label)
            if label in self._live:
                self._index.mark_deleted(label)
                self._live.discard(label)
                self._dirty = True

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._live)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Top-k (memory id, cosine similarity) for one query vector. Of memories tied at the k-th
        score (the same text stored twice), the smallest ids come back: hnswlib leaves ties in
        the order its heap happens to hold them, which differs between an index caught up batch
        by batch and one rebuilt, so it is asked for one more hit, and more while they tie."""
        index = self._index
        if index is None or not self._live or k <= 0:
            return []
        live = len(self._live)
        k = min(k, live)
        query = np.asarray(vector, dtype=np.float32).reshape(1, -1)
        fetch = min(k + 1, live)
        hits = self._query(index, query, fetch)
        while fetch < live and hits[-1][1] == hits[k - 1][1]:
            fetch = min(2 * fetch, live)
            hits = self._query(index, query, fetch)
        return sorted(hits, key=lambda hit: (-hit[1], hit[0]))[:k]

    def _query(self, index: hnswlib.Index, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        index.set_ef(max(self.config.ef_search, k))
        try:
            labels, distances = index.knn_query(query, k=k)
        except RuntimeError:
            # Many deleted labels can starve the beam search; widen it to the whole graph.
            index.set_ef(len(self._known))
            labels, distances = index.knn_query(query, k=k)
        return [(int(label), 1.0 - float(d)) for label, d in zip(labels[0], distances[0], strict=True)]
