"""The hashing embedder backend: chosen by config, deterministic everywhere, unit rows, and
similar exactly as far as texts share stemmed words (which is why it serves plumbing tests and
not semantic recall). MiniLM itself is exercised by the retrieval-quality tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hybridmem_local.config import EmbedderConfig, load_config
from hybridmem_local.embedding import Embedder, HashingEmbedder, build_embedder
from hybridmem_local.errors import ConfigError
from hybridmem_local.memory import HybridMemory
from tests.conftest import REPO
from tests.factories import make_tuple

TEXTS = ["Margaret adopted Biscuit, a three-legged greyhound.", "", "the", "?!", "Ünïcödé naïve café 漢字 👋🏽"]
#: The buckets (384 of them) and signs of TEXTS[0]: six stemmed words ("margaret adopt biscuit
#: three leg greyhound") and their five bigrams, each 1/sqrt(11). Pinned, so a change of
#: tokenizer or hash shows up here, not as indexes silently built another way.
PINNED = {4: -1, 25: -1, 39: -1, 79: -1, 102: -1, 202: -1, 238: 1, 328: -1, 331: 1, 334: -1, 366: -1}


def test_the_config_picks_the_backend_and_its_dimension():
    embedder = build_embedder(EmbedderConfig(backend="hashing", dimension=64))
    assert isinstance(embedder, HashingEmbedder) and isinstance(embedder, Embedder)
    assert (embedder.dimension, embedder.model_id) == (64, "hashing-v1-64d")
    assert load_config(overrides={"embedder.backend": "hashing"}).embedder.dimension == 384
    with pytest.raises(ConfigError, match="embedder.dimension"):
        load_config(overrides={"embedder.backend": "hashing", "embedder.dimension": 8})
    with pytest.raises(ConfigError, match="embedder.backend"):
        load_config(overrides={"embedder.backend": "word2vec"})


def test_rows_are_unit_float32_vectors_even_for_texts_without_words(hashing_embedder):
    vectors = hashing_embedder.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32 and vectors.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    assert hashing_embedder.embed([]).shape == (0, 384)
    # Empty, stopwords only and punctuation only have no word: one shared vector.
    assert np.array_equal(vectors[1], vectors[2]) and np.array_equal(vectors[1], vectors[3])


def test_the_vectors_are_pinned_and_the_same_in_every_process(hashing_embedder):
    vector = hashing_embedder.embed(TEXTS[:1])[0]
    assert {int(i): int(np.sign(vector[i])) for i in np.flatnonzero(vector)} == PINNED
    np.testing.assert_allclose(np.abs(vector[list(PINNED)]), 1 / np.sqrt(11), rtol=1e-6)
    script = (
        "import json, sys; from hybridmem_local.embedding import HashingEmbedder; "
        "print(json.dumps(HashingEmbedder(384).embed(json.loads(sys.argv[1])).tolist()))"
    )
    # str hashing is salted per process (this one's seed is random): the embedder must not use it.
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(TEXTS)], capture_output=True, text=True, env=env, check=True
    )
    assert np.array_equal(np.array(json.loads(done.stdout), dtype=np.float32), hashing_embedder.embed(TEXTS))


def test_similarity_is_shared_stemmed_words_and_word_order_counts_a_little(hashing_embedder):
    texts = ["dog bites man", "man bites dog", "Alice adopted a puppy", "alice ADOPTS puppies!", "dog", "greyhound"]
    similarity = (lambda v: v @ v.T)(hashing_embedder.embed(texts))
    assert similarity[2, 3] == pytest.approx(1.0)  # case, stopwords, inflection and punctuation aside
    assert similarity[0, 1] == pytest.approx(0.6)  # 3 of 5 features: the same words, other bigrams
    assert similarity[0, 2] == 0.0
    assert similarity[4, 5] == 0.0  # no meaning: a greyhound is not a dog to it


def test_a_store_embedded_at_another_dimension_is_reindexed_not_misread(tmp_path):
    path = tmp_path / "m.db"
    wide, narrow = HashingEmbedder(384), HashingEmbedder(64)
    with HybridMemory.open(path, embedder=wide) as memory:
        ids = memory.add_memories(
            "alice", tuples=[make_tuple("Alice", "owns", "a red kayak"), make_tuple("Bob", "sold", "his violin")]
        )
        assert memory.search("violin", namespace="alice").tuples[0].memory.id == ids[1]
    with HybridMemory.open(path, embedder=narrow) as memory:
        memory.config.retrieval.mode = "dense"
        assert memory.search("kayak", namespace="alice").tuples[0].memory.id == ids[0]
    manifest = json.loads((tmp_path / "m.db.indexes" / "alice" / "tuple.manifest.json").read_text())
    assert (manifest["model_id"], manifest["dim"]) == ("hashing-v1-64d", 64)
