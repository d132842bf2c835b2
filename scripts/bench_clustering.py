"""How clustering time and memory grow with the number of memories.

Synthetic data: 384-d unit vectors (MiniLM's shape), 80% of them in gaussian blobs of 10-40
rows on the sphere and 20% spread uniformly as noise. For each N the script times the UMAP
and HDBSCAN stages of the configured clusterer, the process's peak resident memory, and how
well the planted blobs were found (adjusted Rand index on the blob rows). JIT / device
warm-up is timed apart, before any measured run, and a log-log slope over the N values gives
the growth exponent of each stage.

Memory: sizes run in ascending order, so the resident high-water mark read after N is the
peak reached while clustering N; "resident before" is what the process held going in
(interpreter, libraries, compiled kernels). tracemalloc is not used: it misses numba's
allocations and counts untouched zeroed pages.

    python scripts/bench_clustering.py --sizes 1000 5000 --out bench_clustering.json
    python scripts/bench_clustering.py --with-50k --backend gpu      # on a CUDA machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from importlib.metadata import PackageNotFoundError, version

import numpy as np
from rich.console import Console
from rich.table import Table

from hybridmem_local.config import ConsolidationConfig
from hybridmem_local.consolidation.clustering import CPUClusterer, CumlClusterer

DIM = 384
BLOB_FRACTION = 0.8
#: Per-coordinate spread of a blob; in 384-d this puts blob members at cosine ≈ 0.7 to
#: their centre, about what paraphrases of one fact score with MiniLM.
BLOB_SPREAD = 0.05

CLUSTERERS = {"cpu": CPUClusterer, "gpu": CumlClusterer}


def clustered_unit_vectors(n_rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n_rows`` unit vectors and their planted blob ids (-1 for the uniform noise rows)."""
    rng = np.random.default_rng(seed)
    n_blob_rows = int(n_rows * BLOB_FRACTION)
    sizes: list[int] = []
    while sum(sizes) < n_blob_rows:
        sizes.append(int(rng.integers(10, 41)))
    sizes[-1] -= sum(sizes) - n_blob_rows
    truth = np.full(n_rows, -1, dtype=np.int64)
    vectors = rng.standard_normal((n_rows, DIM)).astype(np.float32)  # noise rows stay as drawn
    centres = rng.standard_normal((len(sizes), DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    start = 0
    for blob, size in enumerate(sizes):
        rows = slice(start, start + size)
        vectors[rows] = centres[blob] + BLOB_SPREAD * rng.standard_normal((size, DIM))
        truth[rows] = blob
        start += size
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    order = rng.permutation(n_rows)
    return vectors[order], truth[order]


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _rss_mb() -> float | None:
    """Resident memory now (Linux /proc); None elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
    except OSError:
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def warm_up(clusterer: CPUClusterer | CumlClusterer) -> dict[str, float]:
    """Compile / initialise everything the measured runs will use, and time it."""
    vectors, _ = clustered_unit_vectors(300, seed=1)
    timings = {}
    started = time.perf_counter()
    clusterer.cluster(vectors)
    timings["first_call_s"] = time.perf_counter() - started
    if clusterer.backend == "cpu":
        # umap-learn switches from exact distances to pynndescent at 4096 rows, which has its
        # own numba kernels; forcing the approximate path here compiles them on 300 rows.
        import umap

        params = clusterer.config.umap
        started = time.perf_counter()
        umap.UMAP(
            n_neighbors=params.n_neighbors,
            n_components=params.n_components,
            min_dist=params.min_dist,
            metric=params.metric,
            random_state=params.random_state,
            n_jobs=1,
            force_approximation_algorithm=True,
        ).fit_transform(vectors)
        timings["nndescent_path_s"] = time.perf_counter() - started
    timings["total_s"] = sum(timings.values())
    return timings


def measure(clusterer: CPUClusterer | CumlClusterer, n_rows: int, compare_hdbscan: bool) -> dict:
    from sklearn.metrics import adjusted_rand_score

    vectors, truth = clustered_unit_vectors(n_rows)
    rss_before = _rss_mb()
    started, started_cpu = time.perf_counter(), time.process_time()
    reduced = clusterer.reduce(vectors)
    reduced_at, reduced_at_cpu = time.perf_counter(), time.process_time()
    labels = np.asarray(clusterer.label(reduced))
    finished, finished_cpu = time.perf_counter(), time.process_time()
    planted = truth >= 0
    run = {
        "n_rows": n_rows,
        "umap_s": reduced_at - started,
        "hdbscan_s": finished - reduced_at,
        "total_s": finished - started,
        # CPU seconds over all threads: on a shared machine far steadier than wall time.
        "umap_cpu_s": reduced_at_cpu - started_cpu,
        "hdbscan_cpu_s": finished_cpu - reduced_at_cpu,
        "total_cpu_s": finished_cpu - started_cpu,
        "rss_before_mb": rss_before,
        "max_rss_mb": _max_rss_mb(),
        "planted_blobs": int(truth.max()) + 1,
        "n_clusters": len(set(labels.tolist()) - {-1}),
        "noise_fraction": float(np.mean(labels == -1)),
        "ari_on_blob_rows": float(adjusted_rand_score(truth[planted], labels[planted])),
    }
    if compare_hdbscan:
        run["hdbscan_package"] = _time_hdbscan_package(clusterer.config, reduced, labels)
    return run


def _time_hdbscan_package(config: ConsolidationConfig, reduced: np.ndarray, sklearn_labels: np.ndarray) -> dict:
    """The `hdbscan` package on the same UMAP output: seconds and agreement with scikit-learn."""
    import hdbscan
    from sklearn.metrics import adjusted_rand_score

    params = config.hdbscan
    started = time.perf_counter()
    labels = hdbscan.HDBSCAN(
        min_cluster_size=params.min_cluster_size,
        min_samples=params.min_samples,
        metric=params.metric,
        cluster_selection_method=params.cluster_selection_method,
        # Its default (4 joblib workers) spends ~17 s starting them on a busy 2-core machine.
        core_dist_n_jobs=1,
    ).fit_predict(reduced)
    return {
        "seconds": time.perf_counter() - started,
        "ari_vs_sklearn": float(adjusted_rand_score(sklearn_labels, labels)),
    }


def growth_exponents(runs: list[dict]) -> dict[str, float] | None:
    """Slope of log(seconds) against log(N) per stage: 1 is linear, 2 quadratic."""
    if len(runs) < 2:
        return None
    log_n = np.log([run["n_rows"] for run in runs])
    return {
        stage: float(np.polyfit(log_n, np.log([max(run[stage], 1e-6) for run in runs]), 1)[0])
        for stage in ("umap_s", "hdbscan_s", "total_s", "umap_cpu_s", "hdbscan_cpu_s", "total_cpu_s")
    }


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def render(report: dict, console: Console) -> None:
    warm = report["warmup"]
    console.print(
        f"backend [bold]{report['backend']}[/], {report['machine']['cpu_count']} CPUs, "
        f"load average {report['machine']['load_average_1m']:.1f}; "
        f"warm-up {warm['total_s']:.1f} s ("
        + ", ".join(f"{key} {value:.1f} s" for key, value in warm.items() if key != "total_s")
        + ")"
    )
    table = Table(
        title="UMAP + HDBSCAN on clustered 384-d unit vectors",
        caption="peak RSS: process high-water mark after this N (sizes ascend); "
        "CPU s: all threads; ARI: planted blobs vs found clusters; pkg: the `hdbscan` package, ARI vs sklearn",
    )
    for column in (
        "N",
        "UMAP s",
        "HDBSCAN s",
        "total s",
        "total CPU s",
        "RSS in MB",
        "peak RSS MB",
        "clusters/planted",
        "noise",
        "ARI",
    ):
        table.add_column(column, justify="right")
    compare = any("hdbscan_package" in run for run in report["runs"])
    if compare:
        table.add_column("pkg s", justify="right")
        table.add_column("pkg ARI", justify="right")
    for run in report["runs"]:
        row = [
            f"{run['n_rows']:,}",
            f"{run['umap_s']:.2f}",
            f"{run['hdbscan_s']:.2f}",
            f"{run['total_s']:.2f}",
            f"{run['total_cpu_s']:.2f}",
            _mb(run["rss_before_mb"]),
            _mb(run["max_rss_mb"]),
            f"{run['n_clusters']}/{run['planted_blobs']}",
            f"{run['noise_fraction']:.0%}",
            f"{run['ari_on_blob_rows']:.3f}",
        ]
        if compare:
            package = run["hdbscan_package"]
            row += [f"{package['seconds']:.2f}", f"{package['ari_vs_sklearn']:.3f}"]
        table.add_row(*row)
    console.print(table)
    if report["growth_exponent"]:
        console.print(
            "growth exponent (log-log slope): "
            + ", ".join(f"{stage} {slope:.2f}" for stage, slope in report["growth_exponent"].items())
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--with-50k", action="store_true", help="also run N = 50,000")
    parser.add_argument("--backend", choices=sorted(CLUSTERERS), default="cpu")
    parser.add_argument(
        "--compare-hdbscan", action="store_true", help="also time the `hdbscan` package on the same UMAP output (CPU)"
    )
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)

    sizes = sorted(set(args.sizes + ([50_000] if args.with_50k else [])))
    clusterer = CLUSTERERS[args.backend](ConsolidationConfig())
    console = Console(width=max(Console().width, 120))
    report: dict = {
        "backend": clusterer.backend,
        "machine": {
            "cpu_count": os.cpu_count(),
            # Wall times on a shared machine stretch with its load; read them against this.
            "load_average_1m": os.getloadavg()[0],
            "python": platform.python_version(),
            "packages": {
                name: _package_version(name)
                for name in ("umap-learn", "pynndescent", "numba", "scikit-learn", "hdbscan", "cuml-cu12")
            },
        },
        "config": clusterer.config.model_dump(mode="json"),
        "data": {"dim": DIM, "blob_fraction": BLOB_FRACTION, "blob_spread": BLOB_SPREAD},
    }
    with console.status("warming up (numba JIT / CUDA context)"):
        report["warmup"] = warm_up(clusterer)
    report["runs"] = []
    for n_rows in sizes:
        with console.status(f"clustering {n_rows:,} rows"):
            report["runs"].append(measure(clusterer, n_rows, args.compare_hdbscan))
    report["growth_exponent"] = growth_exponents(report["runs"])
    render(report, console)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
        console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
