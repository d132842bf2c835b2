"""hnswlib indexes: one per (namespace, store kind), a rebuildable cache of the SQLite rows.

Each index lives in ``<store>.indexes/<namespace>/<kind>.*``: the hnswlib graph, the array of
labels it holds as live, and a small JSON manifest (model id, dimension, count). On open the
index is checked against SQLite's set of active ids and caught up (adds and deletions
replayed) or rebuilt from the cached embeddings; a missing, truncated, stale or foreign index
file is never an error. Labels are memory ids, so memory content being immutable means a
live label never points at an outdated vector.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Callable

import hnswlib
import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.config import IndexConfig
from hybridmem_local.files import ensure_private_dir, remove_orphans

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

    def __init__(self, directory: Path, kind: str, model_id: str, dim: int, config: IndexConfig):
        self.directory = directory
        self.kind = kind
        self.model_id = model_id
        self.dim = dim
        self.config = config
        self._index: hnswlib.Index | None = None
        self._live: set[int] = set()
        #: Every label in the graph, live or marked deleted (hnswlib cannot add a label twice).
        self._known: set[int] = set()

    # ------------------------------------------------------------------ files

    @property
    def _manifest_path(self) -> Path:
        return self.directory / f"{self.kind}.manifest.json"

    def _graph_path(self, generation: str) -> Path:
        return self.directory / f"{self.kind}.{generation}.hnsw"

    def _labels_path(self, generation: str) -> Path:
        return self.directory / f"{self.kind}.{generation}.labels.npy"

    def _generation_files(self) -> list[Path]:
        return sorted(self.directory.glob(f"{self.kind}.*.hnsw")) + sorted(self.directory.glob(f"{self.kind}.*.labels.npy"))

    def files(self) -> list[Path]:
        return [self._manifest_path, *self._generation_files()]

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
        if not self._manifest_path.exists():
            return "index files missing"
        try:
            manifest = IndexManifest.model_validate_json(self._manifest_path.read_text())
            if manifest.model_id != self.model_id or manifest.dim != self.dim:
                return f"index built with {manifest.model_id} ({manifest.dim}-d), config uses {self.model_id}"
            labels = np.load(self._labels_path(manifest.generation))
            if len(labels) != manifest.count:
                return "label file does not match manifest"
            index = hnswlib.Index(space="cosine", dim=self.dim)
            index.load_index(
                str(self._graph_path(manifest.generation)), max_elements=max(manifest.count, self.config.initial_capacity)
            )
            index.set_ef(self.config.ef_search)
        except Exception as exc:  # any unreadable file means: rebuild from SQLite
            return f"index unreadable ({type(exc).__name__}: {exc})"
        self._index, self._live = index, set(int(x) for x in labels)
        self._known = set(int(x) for x in index.get_ids_list())
        return None

    def sync(self, active_ids: np.ndarray, vectors_for: VectorSource) -> SyncReport:
        """Make the index hold exactly ``active_ids``: load, catch up, or rebuild."""
        if self._index is None:
            problem = self._load()
            if problem is not None:
                log.info("rebuilding %s index in %s: %s", self.kind, self.directory, problem)
                self._index, self._live, self._known = self._empty(len(active_ids)), set(), set()
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
        """Write a new generation of graph + labels, then switch the manifest to it.

        Replacing the manifest is the single commit point: a crash before it leaves the old
        generation in force, a crash after it the new one; graph and labels never mix.
        """
        if self._index is None:
            return
        ensure_private_dir(self.directory)
        generation = uuid.uuid4().hex[:12]
        graph, labels = self._graph_path(generation), self._labels_path(generation)
        self._index.save_index(str(graph))
        np.save(labels, np.array(sorted(self._live), dtype=np.int64))
        manifest = IndexManifest(model_id=self.model_id, dim=self.dim, count=len(self._live), generation=generation)
        tmp_manifest = self.directory / f"{self.kind}.manifest.{generation}.tmp"  # unique: processes may save at once
        tmp_manifest.write_text(manifest.model_dump_json())
        for path in (graph, labels, tmp_manifest):
            os.chmod(path, 0o600)
        replaced = self._committed_generation()
        os.replace(tmp_manifest, self._manifest_path)
        # Remove only the generation this save replaced: another process may be mid-save with
        # files that no manifest names yet.
        if replaced is not None and replaced != generation:
            self._graph_path(replaced).unlink(missing_ok=True)
            self._labels_path(replaced).unlink(missing_ok=True)
        committed = self._committed_generation()
        named = {self._graph_path(committed), self._labels_path(committed)} if committed else set()
        remove_orphans(
            p for p in [*self._generation_files(), *self.directory.glob(f"{self.kind}.manifest.*.tmp")] if p not in named
        )

    def _committed_generation(self) -> str | None:
        try:
            return IndexManifest.model_validate_json(self._manifest_path.read_text()).generation
        except (OSError, ValueError):
            return None

    def delete_files(self) -> None:
        for path in self.files():
            path.unlink(missing_ok=True)
        self._index, self._live, self._known = None, set(), set()

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
            self._index.add_items(np.asarray(vectors, dtype=np.float32)[fresh], ids[fresh])
            self._known.update(int(x) for x in ids[fresh])
        self._live.update(int(x) for x in ids)

    def remove(self, ids) -> None:
        assert self._index is not None, "sync() first"
        for label in ids:
            label = int(label)
            if label in self._live:
                self._index.mark_deleted(label)
                self._live.discard(label)

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._live)

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Top-k (memory id, cosine similarity) for one query vector."""
        if self._index is None or not self._live or k <= 0:
            return []
        k = min(k, len(self._live))
        query = np.asarray(vector, dtype=np.float32).reshape(1, -1)
        self._index.set_ef(max(self.config.ef_search, k))
        try:
            labels, distances = self._index.knn_query(query, k=k)
        except RuntimeError:
            # Many deleted labels can starve the beam search; widen it to the whole graph.
            self._index.set_ef(len(self._known))
            labels, distances = self._index.knn_query(query, k=k)
        return [(int(label), 1.0 - float(d)) for label, d in zip(labels[0], distances[0])]
