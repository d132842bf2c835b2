"""Embedders: one protocol, implementations chosen by ``embedder.backend`` in the config.

``sentence-transformers`` (the default) runs a model loaded from a local path only (resolved
through ``hybridmem_local/weights/manifest.yaml``; a hub id never reaches ``SentenceTransformer`` at run time).
``hashing`` needs no model file: feature hashing of words, for plumbing tests and tiny
deployments, not for semantic recall.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from hybridmem_local.config import EmbedderConfig
from hybridmem_local.errors import ConfigError

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
        from hybridmem_local.weights.offline import enforce_offline

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
            raise ConfigError(f"embedder {model_id} at {path} does not report its embedding dimension")
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


class HashingEmbedder:
    """Feature hashing of words: a deterministic embedder with no model file.

    A text's features are its words as BM25 sees them (``text.stems.tokenize``: lower-cased,
    English stopwords dropped, Snowball-stemmed) and each pair of adjacent words, so word order
    counts a little. scikit-learn's ``HashingVectorizer`` hashes them (signed MurmurHash3, which
    cancels collisions in expectation) into ``dimension`` buckets, and each row is L2-normalised.
    The same text gives the same vector in every process and on every machine (MurmurHash3 of
    the UTF-8 bytes, no salted ``hash()``, no randomness, nothing trained; tests/test_embedding.py
    pins a vector), in well under a millisecond a text, with nothing to load.

    Good for: tests of everything around the embedder (store, indexes, the facade, every HTTP
    route and MCP tool) and tiny deployments that cannot hold a model, where queries share words
    with what they look for. Not for semantic recall: two texts are near only as far as they
    share stemmed words ("dog" does not find "greyhound"); use sentence-transformers for that.
    """

    #: Names the feature recipe in ``model_id``: bumped when the features or the hashing change,
    #: so embedding caches and indexes built the old way are rebuilt rather than misread.
    RECIPE = "v1"
    #: The feature of a text without any word (empty, punctuation, stopwords only), so that its
    #: row is a unit vector like every other.
    NO_WORDS = "\x00no-words"

    def __init__(self, dimension: int = 384):
        from sklearn.feature_extraction.text import HashingVectorizer

        self.dimension = dimension
        self.model_id = f"hashing-{self.RECIPE}-{dimension}d"
        # The analyzer receives the feature list built in ``embed`` (tokenized in one batch).
        self._vectorizer = HashingVectorizer(
            n_features=dimension, analyzer=list, alternate_sign=True, norm="l2", dtype=np.float32
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        from hybridmem_local.text.stems import tokenize

        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        features = [
            [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))] or [self.NO_WORDS]
            for words in tokenize(texts)
        ]
        return np.ascontiguousarray(self._vectorizer.transform(features).toarray(), dtype=np.float32)


def _build_sentence_transformers(config: EmbedderConfig) -> Embedder:
    from hybridmem_local.weights.resolve import resolve_model

    resolved = resolve_model(config.model, explicit_path=config.path)
    return SentenceTransformerEmbedder(resolved.path, config.model, config.batch_size, config.device)


def _build_hashing(config: EmbedderConfig) -> Embedder:
    return HashingEmbedder(config.dimension)


EMBEDDER_BACKENDS: dict[str, Callable[[EmbedderConfig], Embedder]] = {
    "sentence-transformers": _build_sentence_transformers,
    "hashing": _build_hashing,
}


def build_embedder(config: EmbedderConfig) -> Embedder:
    return EMBEDDER_BACKENDS[config.backend](config)
