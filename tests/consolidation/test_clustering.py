"""The consolidation clusterer: planted near-duplicate memories, small inputs, backend choice.

The CPU path runs for real on MiniLM embeddings; cuML cannot run here, so the GPU path is
driven through a fake ``cuml`` package with the real constructors' keywords (cuML 26.x).
"""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
import types
from collections import Counter

import numpy as np
import pytest

from hybridmem_local.config import ConsolidationConfig
from hybridmem_local.consolidation import clustering
from hybridmem_local.consolidation.clustering import (
    AutoClusterer,
    ClusteringResult,
    CPUClusterer,
    CumlClusterer,
    make_clusterer,
)
from hybridmem_local.errors import ClusteringError

# Four facts, each told twelve ways: what a long dialogue leaves behind as near-duplicates.
PLANTED_TOPICS: dict[str, list[str]] = {
    "dog": [
        "The user has a golden retriever named Biscuit.",
        "Biscuit is the user's golden retriever.",
        "User owns a dog called Biscuit, a golden retriever.",
        "The user's dog, Biscuit, is a golden retriever.",
        "User mentioned their golden retriever Biscuit.",
        "The user adopted a golden retriever and named him Biscuit.",
        "User's pet is a golden retriever whose name is Biscuit.",
        "Biscuit, a golden retriever, belongs to the user.",
        "The user talked about Biscuit, their golden retriever dog.",
        "User has a pet dog: a golden retriever called Biscuit.",
        "The golden retriever the user owns is named Biscuit.",
        "User said their dog Biscuit is a golden retriever.",
    ],
    "move": [
        "The user is moving to Lisbon next spring for a new job.",
        "User will relocate to Lisbon in the spring to start a new job.",
        "Next spring the user moves to Lisbon because of a job offer.",
        "The user got a job in Lisbon and is moving there next spring.",
        "User plans to move to Lisbon next spring for work.",
        "The user's new job means relocating to Lisbon in spring.",
        "User is relocating to Lisbon, Portugal next spring for a job.",
        "In spring the user will move to Lisbon to take a new position.",
        "The user accepted a position in Lisbon and moves next spring.",
        "User said they are moving to Lisbon for a new job next spring.",
        "Moving to Lisbon next spring: the user starts a new job there.",
        "The user will be living in Lisbon from next spring, for a new job.",
    ],
    "allergy": [
        "The user is allergic to peanuts.",
        "User has a peanut allergy.",
        "The user cannot eat peanuts because of an allergy.",
        "User mentioned being allergic to peanuts.",
        "Peanuts cause the user an allergic reaction.",
        "The user has a severe allergy to peanuts.",
        "User must avoid peanuts due to an allergy.",
        "The user said they are allergic to peanuts.",
        "User's peanut allergy means no peanuts in their food.",
        "The user is allergic to peanuts and avoids them.",
        "User reported an allergy to peanuts.",
        "Eating peanuts triggers the user's allergy.",
    ],
    "marathon": [
        "The user is training for the Berlin marathon in September.",
        "User is preparing to run the Berlin marathon this September.",
        "The user signed up for the Berlin marathon in September and is training.",
        "User trains for the September Berlin marathon.",
        "The user will run the Berlin marathon in September.",
        "User is in marathon training for Berlin in September.",
        "The user's goal is the Berlin marathon in September.",
        "User has been training to run the Berlin marathon this September.",
        "In September the user runs the Berlin marathon and is training for it.",
        "The user is getting ready for the Berlin marathon in September.",
        "User said they are training for Berlin's marathon in September.",
        "The Berlin marathon in September is what the user is training for.",
    ],
}

UNRELATED = [
    "The user prefers tea over coffee in the morning.",
    "User's sister works as a nurse in Toronto.",
    "The user is learning to play the cello.",
    "User bought a used Honda Civic last year.",
    "The user's favourite novel is One Hundred Years of Solitude.",
    "User volunteers at a food bank on Saturdays.",
    "The user studied chemical engineering at university.",
    "User is afraid of heights.",
    "The user grows tomatoes and basil on the balcony.",
    "User's birthday is on the fourth of March.",
    "The user recently switched to a standing desk.",
    "User enjoys watching Japanese animated films.",
    "The user's grandmother taught them to knit.",
    "User is saving money for a new laptop.",
    "The user dislikes loud restaurants.",
    "User plays chess online most evenings.",
    "The user has two younger brothers.",
    "User collects vintage postcards.",
    "The user is vegetarian on weekdays.",
    "User fixed the leaking kitchen tap themselves.",
    "The user's team at work uses Kotlin.",
    "User went camping in the Scottish Highlands.",
    "The user wants to learn Mandarin.",
    "User's apartment has a broken heater.",
    "The user listens to jazz while cooking.",
    "User is reading a book about the history of maps.",
    "The user sprained an ankle playing basketball.",
    "User's favourite colour is dark green.",
    "The user is planning a surprise party for a friend.",
    "User takes the night bus home on Fridays.",
]


def _blobs(n_blobs: int = 3, per_blob: int = 20, dim: int = 384, seed: int = 0) -> np.ndarray:
    """Well separated unit-vector blobs, rows grouped blob by blob."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_blobs, dim))
    rows = np.repeat(centres, per_blob, axis=0) + 0.05 * rng.standard_normal((n_blobs * per_blob, dim))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


# --------------------------------------------------------------------------- result model


def test_result_counts_and_groups_rows_by_label():
    result = ClusteringResult(labels=[1, -1, 0, 1, 0, -1, 1], backend="cpu")
    assert result.n_clusters == 2
    assert result.n_noise == 2
    assert result.clusters() == {0: [2, 4], 1: [0, 3, 6]}
    dumped = result.model_dump()
    assert (dumped["n_clusters"], dumped["n_noise"]) == (2, 2)


# --------------------------------------------------------------------------- input checks


@pytest.mark.parametrize(
    ("n_rows", "config", "needed", "rule"),
    [
        (10, ConsolidationConfig(), 11, "umap.n_neighbors"),
        (0, ConsolidationConfig(), 11, "umap.n_neighbors"),
        (15, ConsolidationConfig(umap={"n_components": 20}), 22, "umap.n_components"),
        (15, ConsolidationConfig(hdbscan={"min_cluster_size": 25}), 25, "hdbscan.min_cluster_size"),
    ],
)
def test_small_input_is_skipped_with_the_rule_it_breaks(n_rows, config, needed, rule):
    result = CPUClusterer(config).cluster(_blobs(1, per_blob=20)[:n_rows])
    assert result.labels == [-1] * n_rows
    assert result.n_clusters == 0
    assert result.skipped_reason is not None
    assert f"at least {needed}" in result.skipped_reason
    assert rule in result.skipped_reason


def test_malformed_embeddings_are_rejected_with_what_is_wrong():
    with pytest.raises(ClusteringError, match="2-D"):
        CPUClusterer().cluster(np.zeros(384, dtype=np.float32))
    broken = _blobs()
    broken[7, 3] = np.nan
    with pytest.raises(ClusteringError, match="row 7"):
        CPUClusterer().cluster(broken)


def test_importing_the_module_loads_no_heavy_library():
    # Measured against the package's own imports, so only this module's are judged.
    probe = (
        "import sys, hybridmem_local\n"
        "before = {name.split('.')[0] for name in sys.modules}\n"
        "import hybridmem_local.consolidation.clustering\n"
        "added = {name.split('.')[0] for name in sys.modules} - before\n"
        "heavy = {'umap', 'pynndescent', 'numba', 'sklearn', 'hdbscan', 'cuml', 'cupy', 'torch'}\n"
        "print(sorted(heavy & added))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_registry_maps_config_backends_to_clusterers():
    assert isinstance(make_clusterer(ConsolidationConfig(backend="cpu")), CPUClusterer)
    assert isinstance(make_clusterer(ConsolidationConfig(backend="gpu")), CumlClusterer)
    assert isinstance(make_clusterer(ConsolidationConfig(backend="auto")), AutoClusterer)
    assert isinstance(make_clusterer(), clustering.Clusterer)


# --------------------------------------------------------------------------- fake cuML


class FakeCumlUMAP:
    """cuml.manifold.UMAP's constructor (cuML 26.x); fit_transform projects on top PCs."""

    instances: list[FakeCumlUMAP] = []
    failure: Exception | None = None

    def __init__(
        self,
        *,
        n_neighbors=15,
        n_components=2,
        metric="euclidean",
        metric_kwds=None,
        n_epochs=None,
        learning_rate=1.0,
        min_dist=0.1,
        spread=1.0,
        set_op_mix_ratio=1.0,
        local_connectivity=1.0,
        repulsion_strength=1.0,
        negative_sample_rate=5,
        transform_queue_size=4.0,
        init="spectral",
        a=None,
        b=None,
        target_n_neighbors=-1,
        target_weight=0.5,
        target_metric="categorical",
        hash_input=False,
        random_state=None,
        force_serial_epochs=False,
        precomputed_knn=None,
        callback=None,
        build_algo="auto",
        build_kwds=None,
        fast_transform=False,
        device_ids=None,
        verbose=False,
        output_type=None,
    ):
        self.params = {name: value for name, value in locals().items() if name != "self"}
        FakeCumlUMAP.instances.append(self)

    def fit_transform(self, X, y=None, *, convert_dtype=True, knn_graph=None):
        if FakeCumlUMAP.failure is not None:
            raise FakeCumlUMAP.failure
        # cuML's coerce_metric accepts these (and more) for dense brute-force kNN.
        if self.params["metric"] not in {"euclidean", "l2", "cosine", "correlation", "manhattan"}:
            raise ValueError(f"Invalid value for metric: {self.params['metric']!r}")
        centred = np.asarray(X, dtype=np.float32) - np.mean(X, axis=0)
        _, _, components = np.linalg.svd(centred, full_matrices=False)
        return centred @ components[: self.params["n_components"]].T


class FakeCumlHDBSCAN:
    """cuml.cluster.HDBSCAN's constructor (cuML 26.x); labels from scikit-learn's HDBSCAN."""

    instances: list[FakeCumlHDBSCAN] = []

    def __init__(
        self,
        *,
        min_cluster_size=5,
        min_samples=None,
        cluster_selection_epsilon=0.0,
        max_cluster_size=0,
        metric="euclidean",
        alpha=1.0,
        p=None,
        cluster_selection_method="eom",
        allow_single_cluster=False,
        gen_min_span_tree=False,
        verbose=False,
        output_type=None,
        prediction_data=False,
        build_algo="brute_force",
        build_kwds=None,
        device_ids=None,
    ):
        self.params = {name: value for name, value in locals().items() if name != "self"}
        FakeCumlHDBSCAN.instances.append(self)

    def fit(self, X, y=None, *, convert_dtype="deprecated"):
        from sklearn.cluster import HDBSCAN

        if self.params["metric"] not in {"l2", "euclidean"}:  # all cuML's HDBSCAN accepts
            raise ValueError(f"metric must be one of ['euclidean', 'l2'], got {self.params['metric']!r}")
        self.labels_ = HDBSCAN(
            min_cluster_size=self.params["min_cluster_size"],
            min_samples=self.params["min_samples"],
            cluster_selection_method=self.params["cluster_selection_method"],
            copy=True,
        ).fit_predict(X)
        return self

    def fit_predict(self, X, y=None):
        return self.fit(X).labels_


@pytest.fixture
def fake_cuml(monkeypatch):
    """A ``cuml`` package in sys.modules, with a CUDA device reported visible."""
    package = types.ModuleType("cuml")
    manifold = types.ModuleType("cuml.manifold")
    cluster = types.ModuleType("cuml.cluster")
    manifold.UMAP = FakeCumlUMAP
    cluster.HDBSCAN = FakeCumlHDBSCAN
    package.manifold, package.cluster = manifold, cluster
    for name, module in {"cuml": package, "cuml.manifold": manifold, "cuml.cluster": cluster}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(clustering, "_cuda_device_visible", lambda: (True, "1 CUDA device(s) visible"))
    monkeypatch.setattr(FakeCumlUMAP, "instances", [])
    monkeypatch.setattr(FakeCumlHDBSCAN, "instances", [])
    monkeypatch.setattr(FakeCumlUMAP, "failure", None)
    return package


@pytest.fixture
def no_cuml(monkeypatch):
    for name in ("cuml", "cuml.manifold", "cuml.cluster"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import cuml` raise ImportError


def test_fakes_accept_exactly_the_real_cuml_keywords():
    # Guards the fakes themselves: a keyword cuML 26.x lacks would make the GPU tests lie.
    umap_keywords = set(inspect.signature(FakeCumlUMAP).parameters)
    hdbscan_keywords = set(inspect.signature(FakeCumlHDBSCAN).parameters)
    assert {"n_neighbors", "n_components", "min_dist", "metric", "random_state", "output_type"} <= umap_keywords
    assert {"min_cluster_size", "min_samples", "metric", "cluster_selection_method", "output_type"} <= hdbscan_keywords
    assert "random_state" not in hdbscan_keywords  # cuML's HDBSCAN takes none


def test_auto_uses_cuml_when_it_imports_and_a_device_is_visible(fake_cuml, caplog):
    caplog.set_level(logging.INFO, logger="hybridmem_local.consolidation.clustering")
    config = ConsolidationConfig(backend="auto")
    result = make_clusterer(config).cluster(_blobs())

    assert result.backend == "cuml"
    assert sorted(len(rows) for rows in result.clusters().values()) == [20, 20, 20]
    assert "backend: cuml" in caplog.text
    (umap_model,) = FakeCumlUMAP.instances
    (hdbscan_model,) = FakeCumlHDBSCAN.instances
    assert (
        umap_model.params
        | {
            "n_neighbors": 10,
            "n_components": 5,
            "min_dist": 0.0,
            "metric": "cosine",
            "random_state": config.umap.random_state,
            "output_type": "numpy",
        }
        == umap_model.params
    )
    assert (
        hdbscan_model.params
        | {
            "min_cluster_size": 10,
            "min_samples": 1,
            "metric": "euclidean",
            "cluster_selection_method": "eom",
            "output_type": "numpy",
        }
        == hdbscan_model.params
    )


def test_auto_stays_on_cpu_without_a_visible_device(fake_cuml, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hybridmem_local.consolidation.clustering")
    monkeypatch.setattr(clustering, "_cuda_device_visible", lambda: (False, "no CUDA device visible"))
    result = AutoClusterer().cluster(_blobs(1, per_blob=5))  # small: no UMAP needed to see the choice

    assert result.backend == "cpu"
    assert "backend: cpu (no CUDA device visible)" in caplog.text
    assert FakeCumlUMAP.instances == []


def test_auto_stays_on_cpu_when_cuml_does_not_import(no_cuml, caplog):
    caplog.set_level(logging.INFO, logger="hybridmem_local.consolidation.clustering")
    result = AutoClusterer().cluster(_blobs(1, per_blob=5))

    assert result.backend == "cpu"
    assert "cuml does not import" in caplog.text


def test_explicit_gpu_backend_without_cuml_says_what_to_use_instead(no_cuml):
    with pytest.raises(ImportError, match="'auto' or 'cpu'"):
        CumlClusterer().cluster(_blobs())


def test_auto_rejects_bad_input_instead_of_falling_back(fake_cuml):
    with pytest.raises(ClusteringError):
        AutoClusterer().cluster(np.full((30, 4), np.inf, dtype=np.float32))


@pytest.mark.slow  # the CPU retry runs umap-learn: ~20 s of numba JIT on a cold process
def test_auto_falls_back_to_cpu_when_cuml_fails_at_run_time(fake_cuml, caplog):
    caplog.set_level(logging.INFO, logger="hybridmem_local.consolidation.clustering")
    FakeCumlUMAP.failure = RuntimeError("CUDA error: out of memory")
    result = AutoClusterer().cluster(_blobs())

    assert result.backend == "cpu"
    assert sorted(len(rows) for rows in result.clusters().values()) == [20, 20, 20]
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cuml clustering failed" in warnings[0].getMessage()
    assert "out of memory" in warnings[0].getMessage()


# --------------------------------------------------------------------------- real CPU clustering
#
# UMAP's output depends on row order, and a store's row order is arbitrary, so the planted
# memories are clustered in several orders. Measured over 20 orders with the paper's settings:
# every topic stayed whole in 20/20; topics got separate clusters in 19/20; the unrelated
# sentences were never noise (min_samples = 1 leaves almost nothing out) and 3-8 of the 30
# joined a planted cluster, except in 4/20 orders where they all joined one (EOM preferred the
# merged parent). The assertions below keep a margin on those figures.

ROW_ORDERS = range(8)


@pytest.fixture(scope="module")
def memory_embeddings(minilm) -> tuple[np.ndarray, list[str]]:
    """MiniLM embeddings of the planted paraphrases and the unrelated sentences, and their topics."""
    texts = [(topic, text) for topic, texts in PLANTED_TOPICS.items() for text in texts]
    texts += [("unrelated", text) for text in UNRELATED]
    return minilm.embed([text for _, text in texts]), [topic for topic, _ in texts]


@pytest.fixture(scope="module")
def clustered_orders(memory_embeddings) -> list[tuple[ClusteringResult, list[str]]]:
    """The CPU clusterer's result, and the topic of each row, for each of ROW_ORDERS."""
    vectors, topics = memory_embeddings
    clusterer = CPUClusterer(ConsolidationConfig())
    runs = []
    for seed in ROW_ORDERS:
        order = np.random.default_rng(seed).permutation(len(topics))
        runs.append((clusterer.cluster(vectors[order]), [topics[row] for row in order]))
    return runs


def _topic_labels(result: ClusteringResult, topics: list[str]) -> dict[str, Counter]:
    return {
        topic: Counter(label for label, row_topic in zip(result.labels, topics, strict=True) if row_topic == topic)
        for topic in PLANTED_TOPICS
    }


@pytest.mark.slow  # MiniLM load + umap-learn's numba JIT
def test_cpu_clusterer_keeps_each_planted_topic_whole(clustered_orders):
    for result, topics in clustered_orders:
        assert result.backend == "cpu" and result.skipped_reason is None
        assert result.umap_s > 0 and result.hdbscan_s > 0
        for topic, labels in _topic_labels(result, topics).items():
            label, members = labels.most_common(1)[0]
            assert label != -1, f"{topic}: paraphrases left as noise ({labels})"
            assert members >= 11, f"{topic}: only {members}/12 paraphrases share a label ({labels})"


@pytest.mark.slow
def test_cpu_clusterer_keeps_planted_topics_apart(clustered_orders):
    separated = 0
    for result, topics in clustered_orders:
        majority = {topic: labels.most_common(1)[0][0] for topic, labels in _topic_labels(result, topics).items()}
        separated += len(set(majority.values())) == len(PLANTED_TOPICS)
    assert separated >= 0.75 * len(ROW_ORDERS), f"topics separated in only {separated}/{len(ROW_ORDERS)} orders"


@pytest.mark.slow
def test_cpu_clusterer_keeps_most_unrelated_memories_out_of_planted_clusters(clustered_orders):
    absorbed = []
    for result, topics in clustered_orders:
        planted = {labels.most_common(1)[0][0] for labels in _topic_labels(result, topics).values()}
        absorbed.append(
            sum(
                1
                for label, topic in zip(result.labels, topics, strict=True)
                if topic == "unrelated" and label in planted
            )
        )
    assert np.median(absorbed) <= len(UNRELATED) / 3, f"unrelated rows in planted clusters per order: {absorbed}"


@pytest.mark.slow
def test_cpu_clusterer_is_deterministic(memory_embeddings, clustered_orders):
    vectors, topics = memory_embeddings
    first, _ = clustered_orders[0]
    order = np.random.default_rng(ROW_ORDERS[0]).permutation(len(topics))
    assert CPUClusterer(ConsolidationConfig()).cluster(vectors[order]).labels == first.labels
