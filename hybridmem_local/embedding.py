"""Embedders: one protocol, a sentence-transformers implementation, chosen by config.

Models are loaded from local paths only (resolved through ``models/manifest.yaml``); a hub
id never reaches ``SentenceTransformer`` at run time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from hybridmem_local.config import EmbedderConfig

log = logging.getLogger(__name__)


@runtime_checkable
class Embedder(Protocol):
    #: Identifies the model (name + version) for caches and index manifests.
    model_id: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dimension), rows L2-normalised."""
        ...


class SentenceTransformerEmbedder:
    """sentence-transformers model loaded from a local directory, on CPU or CUDA."""

    def __init__(self, path: Path, model_id: str, batch_size: int = 64, device: str = "auto"):
        from hybridmem_local.offline import enforce_offline

        enforce_offline()
        import torch
        from sentence_transformers import SentenceTransformer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        started = time.perf_counter()
        self._model = SentenceTransformer(str(path), device=device, local_files_only=True)
        log.info("loaded embedder %s from %s on %s in %.1fs", model_id, path, device, time.perf_counter() - started)
        self.model_id = model_id
        # sentence-transformers 6 renamed the accessor; older releases only have the long name.
        dimension_of = (
            getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        )
        dimension = dimension_of()
        if dimension is None:
            raise ValueError(f"embedder {model_id} at {path} does not report its embedding dimension")
        self.dimension = int(dimension)
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


def _build_sentence_transformers(config: EmbedderConfig) -> Embedder:
    from hybridmem_local.model_registry import resolve_model

    resolved = resolve_model(config.model, explicit_path=config.path)
    return SentenceTransformerEmbedder(resolved.path, config.model, config.batch_size, config.device)


EMBEDDER_BACKENDS: dict[str, Callable[[EmbedderConfig], Embedder]] = {
    "sentence-transformers": _build_sentence_transformers,
}


def build_embedder(config: EmbedderConfig) -> Embedder:
    return EMBEDDER_BACKENDS[config.backend](config)
