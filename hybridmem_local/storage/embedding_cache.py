"""The ``embeddings`` table: vectors by (namespace, model, text hash), so a text is embedded once
and an index can be rebuilt without the embedding model."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from hybridmem_local.storage.connection import Database, chunks
from hybridmem_local.storage.namespaces import Namespaces


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    def __init__(self, db: Database, namespaces: Namespaces):
        self.db = db
        self.namespaces = namespaces

    def get(self, namespace: str, model_id: str, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Cached vectors by text hash (missing texts are simply absent)."""
        hashes = sorted({text_hash(t) for t in texts})
        found: dict[str, np.ndarray] = {}
        for chunk in chunks(hashes):
            marks = ",".join("?" * len(chunk))
            for h, dim, blob in self.db.conn.execute(
                "SELECT text_hash, dim, vector FROM embeddings WHERE namespace = ? AND model_id = ? AND text_hash "
                f"IN ({marks})",
                (namespace, model_id, *chunk),
            ):
                found[h] = np.frombuffer(blob, dtype=np.float32, count=dim)
        return found

    def put(self, namespace: str, model_id: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with self.db.transaction() as c:
            self.namespaces.ensure(namespace)
            c.executemany(
                "INSERT OR REPLACE INTO embeddings (namespace, model_id, text_hash, dim, vector) VALUES (?, ?, ?, ?, "
                "?)",
                [
                    (namespace, model_id, text_hash(t), vectors.shape[1], v.tobytes())
                    for t, v in zip(texts, vectors, strict=True)
                ],
            )
