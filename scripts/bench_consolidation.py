"""Consolidation at several HDBSCAN min_cluster_size values: compression, LLM calls, timings.

The paper's cluster-size ablation (§5.3, Table 5): compression falls from 30.9% at mcs 2 to
9.6% at mcs 20 while clusters, and so LLM consolidation calls, fall by up to 15×. This script
measures the same on a curated store (e.g. a LoCoMo conversation ingested with curation):
every mcs runs on a fresh copy of the store, so the runs do not build on each other, with the
configured LLM behind the call cache beside the original store (a rerun costs no LLM calls).

    python scripts/bench_consolidation.py --store locomo.db --namespace conv-26 --config configs/vllm-server.yaml
    python scripts/bench_consolidation.py --store locomo.db --namespace conv-26 --clusters-only

``--clusters-only`` skips the LLM: it reports clusters and noise per mcs (each cluster is one
LLM call unless it must be split to fit the context) and the embedding / UMAP / HDBSCAN times.

Without a curated store, ``--locomo-observations FILE`` builds a stand-in at ``--store`` (when
it does not exist yet): the raw sessions of conversation ``--namespace`` plus LoCoMo's own
per-session observations (facts about each speaker written by the benchmark's authors with an
LLM, with evidence turn ids), one episode each, dated with its session. They are short facts
where our curation writes episodes and tuples, so figures on them are a proxy, not the paper's.

    python scripts/bench_consolidation.py --store /tmp/conv-26.db --namespace conv-26 \
        --locomo-observations ../shared/data/locomo/locomo_dev8.json --clusters-only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from hybridmem_local.config import load_config
from hybridmem_local.consolidation.clustering import make_clusterer
from hybridmem_local.consolidation.planner import KINDS
from hybridmem_local.llm import build_llm
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import EpisodeDraft
from hybridmem_local.storage.store import MemoryStore

console = Console()


def build_from_locomo_observations(locomo: Path, conversation_id: str, store: Path, config_path: Path | None) -> int:
    """Write the stand-in store described in the module docstring; returns the memories written."""
    from hybridmem_local.eval.locomo import load_locomo

    conversation = next((c for c in load_locomo(locomo).conversations if c.sample_id == conversation_id), None)
    if conversation is None:
        sys.exit(f"error: {locomo} has no conversation {conversation_id!r}")
    raw = next(s for s in json.loads(locomo.read_text(encoding="utf-8")) if s["sample_id"] == conversation_id)
    written = 0
    with HybridMemory.open(store, load_config(config_path)) as memory:
        for session in conversation.sessions:
            number = session.session_id.rsplit("_", 1)[1]
            turn_ids = {t.turn_id for t in session.turns}
            episodes = []
            for speaker, facts in raw.get("observation", {}).get(f"session_{number}_observation", {}).items():
                for text, evidence in facts:
                    cited = [evidence] if isinstance(evidence, str) else list(evidence)
                    episodes.append(
                        EpisodeDraft(
                            title=f"{speaker}, session {number}",
                            summary=text,
                            details=text,
                            timestamp=session.started_at.date().isoformat(),
                            source_turn_ids=[
                                t for t in cited if t in turn_ids
                            ],  # the file cites a few turns that do not exist
                        )
                    )
            written += len(memory.add_memories(conversation.namespace, episodes=episodes, session=session))
    return written


def clusters_only(memory: HybridMemory, namespace: str) -> dict:
    clusterer = make_clusterer(memory.config.consolidation)
    row: dict = {"stores": {}, "timings": {"embed_load_s": 0.0, "umap_s": 0.0, "hdbscan_s": 0.0}, "backend": ""}
    for kind in KINDS:
        active = memory.list(namespace, kind)
        started = time.perf_counter()
        vectors = memory.indexes.embed(namespace, [m.index_text() for m in active])
        row["timings"]["embed_load_s"] += time.perf_counter() - started
        result = clusterer.cluster(vectors)
        row["backend"] = result.backend
        row["timings"]["umap_s"] += result.umap_s
        row["timings"]["hdbscan_s"] += result.hdbscan_s
        row["stores"][kind] = {
            "memories_before": len(active),
            "clusters": result.n_clusters,
            "noise": result.n_noise,
            "clustered": len(active) - result.n_noise,
            "clustering_skipped": result.skipped_reason,
        }
    return row


def warm_up(config_path: Path | None) -> float:
    """Compile UMAP's numba kernels once, untimed, so the first mcs is not charged for them."""
    started = time.perf_counter()
    vectors = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    make_clusterer(load_config(config_path).consolidation).cluster(vectors)
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    embedder = None
    console.print(f"clustering warm-up (JIT): {warm_up(args.config):.1f}s")
    with tempfile.TemporaryDirectory(prefix="bench_consolidation_") as workdir:
        for mcs in args.mcs:
            copy = Path(workdir) / f"mcs{mcs}.db"
            source = MemoryStore(args.store)
            source.backup_to(copy)  # consistent even while another process writes
            source.close()
            config = load_config(args.config, {"consolidation.hdbscan.min_cluster_size": mcs})
            llm = None
            if not args.clusters_only:
                # The original store's call cache: runs at different mcs share identical prompts.
                llm = build_llm(config.llm, cache_path=Path(str(args.store) + ".llm_cache.sqlite"))
            with HybridMemory.open(copy, config, embedder=embedder, llm=llm) as memory:
                embedder = memory.embedder  # loaded once, shared by every mcs
                started = time.perf_counter()
                if args.clusters_only:
                    row = clusters_only(memory, args.namespace)
                else:
                    report = memory.consolidate(args.namespace, llm=llm)
                    row = json.loads(report.model_dump_json())
                    row["compression_pct"] = report.compression_pct
                    for kind, stats in report.stores.items():
                        row["stores"][kind]["compression_pct"] = stats.compression_pct
                row["mcs"] = mcs
                row["wall_s"] = time.perf_counter() - started
            rows.append(row)
            # Each mcs is shown and saved as it finishes: on CPU one takes tens of minutes.
            console.print(table([row], args.clusters_only))
            if args.out is not None:
                args.out.write_text(json.dumps(rows, indent=2))
    return rows


def table(rows: list[dict], clusters_only_mode: bool) -> Table:
    t = Table(
        title="Consolidation by HDBSCAN min_cluster_size" + (" (clusters only, no LLM)" if clusters_only_mode else "")
    )
    columns = ["mcs", "episodes", "tuples", "clusters", "noise"]
    if not clusters_only_mode:
        columns += ["compression", "LLM calls", "plans skipped", "LLM s", "apply s"]
    columns += ["embed s", "UMAP s", "HDBSCAN s"]
    for column in columns:
        t.add_column(column, justify="right")
    for row in rows:
        stores = row["stores"]
        if clusters_only_mode:
            sizes = [f"{s['clustered']}/{s['memories_before']} clustered" for s in stores.values()]
        else:
            sizes = [f"{s['memories_before']} → {s['memories_after']}" for s in stores.values()]
        cells = [
            str(row["mcs"]),
            *sizes,
            str(sum(s["clusters"] for s in stores.values())),
            str(sum(s["noise"] for s in stores.values())),
        ]
        if not clusters_only_mode:
            cells += [
                f"{row['compression_pct']:.1f}%",
                str(row["llm"]["requests"]),
                str(sum(s["invalid_plans_skipped"] for s in stores.values())),
                f"{row['timings']['llm_s']:.1f}",
                f"{row['timings']['apply_s']:.2f}",
            ]
        timings = row["timings"]
        cells += [f"{timings['embed_load_s']:.1f}", f"{timings['umap_s']:.1f}", f"{timings['hdbscan_s']:.2f}"]
        t.add_row(*cells)
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store", type=Path, required=True, help="a curated SQLite store (it is copied, never changed)"
    )
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--config", type=Path, default=None, help="YAML config (LLM, embedder, UMAP/HDBSCAN)")
    parser.add_argument("--mcs", type=int, nargs="+", default=[2, 5, 10, 20], help="min_cluster_size values")
    parser.add_argument(
        "--locomo-observations",
        type=Path,
        default=None,
        help="build --store from this LoCoMo file's observations when --store does not exist",
    )
    parser.add_argument("--clusters-only", action="store_true", help="cluster without calling the LLM")
    parser.add_argument("--out", type=Path, default=None, help="write the per-mcs reports as JSON (after each mcs)")
    args = parser.parse_args()
    if args.locomo_observations is not None and not args.store.exists():
        written = build_from_locomo_observations(args.locomo_observations, args.namespace, args.store, args.config)
        console.print(f"built {args.store}: {written} observation memories of {args.namespace}")
    if not args.store.exists():
        sys.exit(f"error: store {args.store} does not exist")
    rows = run(args)
    console.print(table(rows, args.clusters_only))
    if args.out is not None:
        console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
