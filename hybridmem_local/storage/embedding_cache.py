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
            for row in self.db.execute(
                "SELECT text_hash, dim, vector FROM embeddings "
                "WHERE namespace = :namespace AND model_id = :model_id AND text_hash IN :text_hashes",
                {"namespace": namespace, "model_id": model_id, "text_hashes": chunk},
            ):
                found[row.text_hash] = np.frombuffer(row.vector, dtype=np.float32, count=row.dim)
        return found

    def put(self, namespace: str, model_id: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with self.db.transaction() as c:
            self.namespaces.ensure(namespace)
            c.executemany(
                "INSERT INTO embeddings (namespace, model_id, text_hash, dim, vector) "
                "VALUES (:namespace, :model_id, :text_hash, :dim, :vector) "
                "ON CONFLICT (namespace, model_id, text_hash) "
                "DO UPDATE SET dim = excluded.dim, vector = excluded.vector",
                [
                    {
                        "namespace": namespace,
                        "model_id": model_id,
                        "text_hash": text_hash(t),
                        "dim": vectors.shape[1],
                        "vector": v.tobytes(),
                    }
                    for t, v in zip(texts, vectors, strict=True)
                ],
            )
