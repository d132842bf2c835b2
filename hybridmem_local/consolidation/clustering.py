"""Clustering for offline consolidation: UMAP, then HDBSCAN (paper §3.2, appendix C).

Memory embeddings are projected with UMAP (cosine, 10 neighbours, 5 components, min_dist 0)
and the projection is clustered with HDBSCAN (euclidean, excess of mass, min cluster size 10,
min samples 1). Each cluster is a group of near-duplicate or related memories that the
planner then merges or prunes; noise rows (label -1) are left alone.

Two backends share the :class:`Clusterer` protocol and are picked by
``ConsolidationConfig.backend`` through :data:`CLUSTERERS`:

- ``"cpu"``: umap-learn + scikit-learn (:class:`CPUClusterer`);
- ``"gpu"``: cuML (:class:`CumlClusterer`);
- ``"auto"``: cuML when it imports and a CUDA device is visible, else the CPU libraries,
  with a CPU retry if cuML fails at run time (:class:`AutoClusterer`).

umap-learn compiles its numba kernels on first use (15-20 s, more the first time a call has
4096+ rows), so it, cuML and scikit-learn are imported inside the methods that run them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, computed_field

from hybridmem_local.config import ConsolidationConfig
from hybridmem_local.errors import ClusteringError

logger = logging.getLogger(__name__)

NOISE = -1

Backend = Literal["cuml", "cpu"]


class ClusteringResult(BaseModel):
    """Cluster labels for the rows of one embedding matrix, in row order."""

    model_config = ConfigDict(frozen=True)

    #: One label per input row; -1 marks noise (a row that joined no cluster).
    labels: list[int]
    backend: Backend
    #: Why clustering did not run (input too small); None when it ran.
    skipped_reason: str | None = None
    umap_s: float = 0.0
    hdbscan_s: float = 0.0

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented idiom; mypy rejects decorated properties
    @property
    def n_clusters(self) -> int:
        return len({label for label in self.labels if label != NOISE})

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented idiom; mypy rejects decorated properties
    @property
    def n_noise(self) -> int:
        return sum(1 for label in self.labels if label == NOISE)

    def clusters(self) -> dict[int, list[int]]:
        """Row positions per cluster label, noise left out, labels in ascending order."""
        members: dict[int, list[int]] = {}
        for row, label in enumerate(self.labels):
            if label != NOISE:
                members.setdefault(label, []).append(row)
        return dict(sorted(members.items()))


@runtime_checkable
class Clusterer(Protocol):
    def cluster(self, embeddings: np.ndarray) -> ClusteringResult:
        """Label each row of ``embeddings`` (n_rows × dim) with a cluster id or -1."""
        ...


def _as_matrix(embeddings: np.ndarray) -> np.ndarray:
    matrix = np.asarray(embeddings, dtype=np.float32)
    if matrix.ndim != 2:
        raise ClusteringError(f"embeddings must be a 2-D matrix (rows × dim), got shape {matrix.shape}")
    if matrix.shape[0] > 0 and matrix.shape[1] == 0:
        raise ClusteringError(f"embeddings have no columns (shape {matrix.shape})")
    bad_rows = np.flatnonzero(~np.isfinite(matrix).all(axis=1))
    if bad_rows.size:
        raise ClusteringError(
            f"embeddings contain NaN or infinite values in {bad_rows.size} row(s), first at row {int(bad_rows[0])}"
        )
    return matrix


def _too_small(n_rows: int, config: ConsolidationConfig) -> str | None:
    """Say why ``n_rows`` rows cannot be clustered with ``config``, or None when they can."""
    requirements = [
        # UMAP's neighbour graph needs n_neighbors other rows per row.
        (config.umap.n_neighbors + 1, f"umap.n_neighbors + 1 = {config.umap.n_neighbors + 1}"),
        # Spectral initialisation solves for n_components + 1 eigenvectors of an n_rows graph.
        (config.umap.n_components + 2, f"umap.n_components + 2 = {config.umap.n_components + 2}"),
        # Below min_cluster_size rows HDBSCAN can only answer "all noise".
        (config.hdbscan.min_cluster_size, f"hdbscan.min_cluster_size = {config.hdbscan.min_cluster_size}"),
        (config.hdbscan.min_samples + 1, f"hdbscan.min_samples + 1 = {config.hdbscan.min_samples + 1}"),
    ]
    needed, rule = max(requirements, key=lambda requirement: requirement[0])
    if n_rows < needed:
        return f"{n_rows} rows, clustering needs at least {needed} ({rule})"
    return None


class _UmapHdbscanClusterer:
    """UMAP to ``config.umap.n_components`` dimensions, then HDBSCAN; subclasses bind a library."""

    backend: ClassVar[Backend]

    def __init__(self, config: ConsolidationConfig | None = None) -> None:
        self.config = config or ConsolidationConfig()

    def cluster(self, embeddings: np.ndarray) -> ClusteringResult:
        matrix = _as_matrix(embeddings)
        n_rows = matrix.shape[0]
        if reason := _too_small(n_rows, self.config):
            logger.info("clustering skipped: %s", reason)
            return ClusteringResult(labels=[NOISE] * n_rows, backend=self.backend, skipped_reason=reason)
        started = time.perf_counter()
        reduced = self.reduce(matrix)
        reduced_at = time.perf_counter()
        labels = self.label(reduced)
        finished = time.perf_counter()
        result = ClusteringResult(
            labels=[int(label) for label in labels],
            backend=self.backend,
            umap_s=reduced_at - started,
            hdbscan_s=finished - reduced_at,
        )
        logger.info(
            "clustered %d rows on %s: %d clusters, %d noise (UMAP %.2f s, HDBSCAN %.2f s)",
            n_rows,
            self.backend,
            result.n_clusters,
            result.n_noise,
            result.umap_s,
            result.hdbscan_s,
        )
        return result

    def reduce(self, matrix: np.ndarray) -> np.ndarray:
        """UMAP stage: (n_rows × dim) float32 → (n_rows × n_components); no input checks."""
        raise NotImplementedError

    def label(self, reduced: np.ndarray) -> np.ndarray:
        """HDBSCAN stage: one label per row of the UMAP output, -1 for noise."""
        raise NotImplementedError


class CPUClusterer(_UmapHdbscanClusterer):
    """umap-learn + scikit-learn's HDBSCAN."""

    backend = "cpu"

    def reduce(self, matrix: np.ndarray) -> np.ndarray:
        import umap

        params = self.config.umap
        reducer = umap.UMAP(
            n_neighbors=params.n_neighbors,
            n_components=params.n_components,
            min_dist=params.min_dist,
            metric=params.metric,
            random_state=params.random_state,
            # A fixed random_state makes umap-learn run single-threaded anyway; saying so
            # here silences its "n_jobs overridden" warning on every call.
            n_jobs=1,
        )
        return np.asarray(reducer.fit_transform(matrix))

    def label(self, reduced: np.ndarray) -> np.ndarray:
        # scikit-learn's HDBSCAN rather than the `hdbscan` package: identical clusters on 5-d
        # UMAP output (ARI 1.0 at 5k and 20k rows) and no extra dependency. The package is
        # faster on large stores (20k rows: 0.75 s single-threaded vs 4.7 s; 5k: 0.15 vs 0.26 s),
        # but HDBSCAN stays well under UMAP's cost at those sizes; revisit past ~50k rows.
        # (scripts/bench_clustering.py --compare-hdbscan)
        from sklearn.cluster import HDBSCAN

        params = self.config.hdbscan
        clusterer = HDBSCAN(
            min_cluster_size=params.min_cluster_size,
            min_samples=params.min_samples,
            metric=params.metric,
            cluster_selection_method=params.cluster_selection_method,
            # `copy` only matters for precomputed distances; set to silence scikit-learn
            # 1.9's warning about its default changing.
            copy=False,
        )
        return clusterer.fit_predict(reduced)


class CumlClusterer(_UmapHdbscanClusterer):
    """cuML's UMAP and HDBSCAN on a CUDA device.

    Not exercised here: this machine has no GPU, and cuML cannot share an environment with
    vLLM (numba pins). Written against cuML 26.x (``cuml.manifold.UMAP`` and
    ``cuml.cluster.HDBSCAN``, keyword-only constructors, ``output_type="numpy"`` so results
    come back as host arrays); the tests drive it through a fake ``cuml`` module of that shape.
    """

    backend = "cuml"

    def reduce(self, matrix: np.ndarray) -> np.ndarray:
        try:
            from cuml.manifold import UMAP
        except ImportError as exc:
            raise ImportError(
                "consolidation.backend 'gpu' needs cuML (e.g. pip install cuml-cu12) and a CUDA "
                f"device; use 'auto' or 'cpu' on this machine ({exc})"
            ) from exc

        params = self.config.umap
        # With random_state set, cuML builds the kNN graph by brute force (deterministic).
        reducer = UMAP(
            n_neighbors=params.n_neighbors,
            n_components=params.n_components,
            min_dist=params.min_dist,
            metric=params.metric,
            random_state=params.random_state,
            output_type="numpy",
        )
        return np.asarray(reducer.fit_transform(matrix), dtype=np.float32)

    def label(self, reduced: np.ndarray) -> np.ndarray:
        from cuml.cluster import HDBSCAN

        params = self.config.hdbscan
        clusterer = HDBSCAN(
            min_cluster_size=params.min_cluster_size,
            min_samples=params.min_samples,
            metric=params.metric,
            cluster_selection_method=params.cluster_selection_method,
            output_type="numpy",
        )
        return np.asarray(clusterer.fit_predict(reduced))


def _cuda_device_visible() -> tuple[bool, str]:
    """Whether a CUDA device is visible, and why not; asks cupy (which cuML depends on)."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no cupy, no driver, CUDA_VISIBLE_DEVICES="" ...
        return False, f"no CUDA device visible ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "no CUDA device visible (0 devices)"
    return True, f"{count} CUDA device(s) visible"


def cuml_usable() -> tuple[bool, str]:
    """Whether the GPU clusterer can run here (cuML imports, a CUDA device is visible), and why."""
    try:
        import cuml  # noqa: F401 - imported only to learn whether it imports
    except Exception as exc:  # ImportError, or a CUDA library failing to load
        return False, f"cuml does not import ({type(exc).__name__}: {exc})"
    return _cuda_device_visible()


class AutoClusterer:
    """cuML when it imports and a CUDA device is visible, else the CPU libraries.

    The choice is made (and logged) on the first call, so building a clusterer stays cheap.
    If cuML raises at run time the same input is clustered on the CPU, with a warning.
    """

    def __init__(self, config: ConsolidationConfig | None = None) -> None:
        self.config = config or ConsolidationConfig()
        self._cpu = CPUClusterer(self.config)
        self._gpu: CumlClusterer | None = None
        self._chosen = False

    def _choose(self) -> CumlClusterer | None:
        if not self._chosen:
            usable, why = cuml_usable()
            if usable:
                logger.info("consolidation clustering backend: cuml (%s)", why)
                self._gpu = CumlClusterer(self.config)
            else:
                logger.info("consolidation clustering backend: cpu (%s)", why)
            self._chosen = True
        return self._gpu

    def cluster(self, embeddings: np.ndarray) -> ClusteringResult:
        matrix = _as_matrix(embeddings)  # bad input is an error, not a reason to fall back
        gpu = self._choose()
        if gpu is None:
            return self._cpu.cluster(matrix)
        try:
            return gpu.cluster(matrix)
        except Exception as exc:
            logger.warning(
                "cuml clustering failed (%s: %s); clustering %d rows on the CPU instead",
                type(exc).__name__,
                exc,
                matrix.shape[0],
            )
            return self._cpu.cluster(matrix)


#: ``ConsolidationConfig.backend`` → clusterer class.
CLUSTERERS: dict[str, Callable[[ConsolidationConfig], Clusterer]] = {
    "auto": AutoClusterer,
    "cpu": CPUClusterer,
    "gpu": CumlClusterer,
}


def make_clusterer(config: ConsolidationConfig | None = None) -> Clusterer:
    """The clusterer that ``config.backend`` names."""
    config = config or ConsolidationConfig()
    return CLUSTERERS[config.backend](config)
