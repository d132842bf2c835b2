"""What the audit trail costs a search: ``HybridMemory.search()`` with ``audit.enabled`` on and off,
against embedding the query alone, interleaved in one run on one store (bench_search.py's store:
N synthetic MiniLM-like memories and N LoCoMo turns, the real MiniLM query embedding).

One ``HybridMemory`` runs every search, its ``audit.enabled`` switched between calls (the calls
rotate, so drift on shared cores hits all alike): a second instance would see the first one's
audit commits as another connection's and re-check its indexes, which is not what a process
with the audit on pays. Also timed: the audit write alone (``store.audit.record`` of one entry,
its own short transaction) and the same write while another connection holds the write lock
(the entry then goes to the writer thread after ``storage.audit.LOCK_WAIT_MS``).

    python scripts/bench_audit.py --size 2000 --queries 100 --out runs/bench_audit.json
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
console = Console()


def _bench_search():
    spec = importlib.util.spec_from_file_location("bench_search", REPO / "scripts" / "bench_search.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_search"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=2000, help="memories (and raw turns) in the store")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--setting", choices=["dense", "hybrid", "hybrid+windows"], default="hybrid+windows")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    bench = _bench_search()
    from hybridmem_local.config import load_config
    from hybridmem_local.memory import HybridMemory
    from hybridmem_local.storage.audit import AuditScope

    bench.set_threads(args.threads)
    embedder = bench.load_embedder()
    turns, questions = bench.locomo_texts(bench.DEFAULT_LOCOMO)
    base = bench.cached_embeddings(embedder, [t for _, t in turns], bench.DEFAULT_CACHE, "locomo_turns")
    questions = random.Random(0).sample(questions, min(args.queries, len(questions)))
    vectors, sources = bench.synthetic_vectors(base, args.size, "paraphrase")
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "bench.db"
        bench.build_store(db, embedder.model_id, turns, vectors, sources)
        if args.setting == "hybrid+windows":
            bench.build_turns(db, embedder.model_id, turns, base, args.size)
        config = load_config(overrides=bench.SETTINGS[args.setting])
        with HybridMemory.open(db, config, embedder=embedder) as memory:
            memory.search(questions[0], "bench")  # loads or builds the indexes

            def search_with(enabled: bool, question: str) -> None:
                memory.config.audit.enabled = enabled
                memory.search(question, "bench")

            samples: dict[str, list[float]] = {"embed": [], "audit off": [], "audit on": []}
            for i, question in enumerate(questions):
                calls = [
                    ("embed", memory.indexes.embed_query, (question,)),
                    ("audit off", search_with, (False, question)),
                    ("audit on", search_with, (True, question)),
                ]
                for name, fn, fn_args in calls[i % 3 :] + calls[: i % 3]:
                    samples[name].append(bench.timed(fn, *fn_args)[0])

            def one_entry() -> None:
                scope = AuditScope(actor="bench", action="HybridMemory.search")
                scope.note("bench", read=list(range(30)), windows=list(range(10)))
                memory.store.audit.record(scope)

            write = [bench.timed(one_entry)[0] for _ in range(200)]
            other = sqlite3.connect(db, isolation_level=None, timeout=0)
            other.execute("BEGIN IMMEDIATE")
            locked = [bench.timed(one_entry)[0] for _ in range(10)]
            other.execute("COMMIT")
            other.close()
            memory.store.audit.flush()
            verdict = memory.store.audit.verify()
    results = {
        "size": args.size,
        "setting": args.setting,
        "queries": len(questions),
        "machine": bench.machine(),
        **{name: bench.summary(values) for name, values in samples.items()},
        "audit_write": bench.summary(write),
        "audit_write_while_locked": bench.summary(locked),
        "chain_ok": verdict.ok,
        "entries": verdict.entries,
    }
    results["ratio_p95_on_over_embed"] = results["audit on"]["p95_ms"] / results["embed"]["p95_ms"]
    results["ratio_p95_off_over_embed"] = results["audit off"]["p95_ms"] / results["embed"]["p95_ms"]
    results["ratio_p95_on_over_off"] = results["audit on"]["p95_ms"] / results["audit off"]["p95_ms"]
    results["ratio_p50_on_over_off"] = results["audit on"]["p50_ms"] / results["audit off"]["p50_ms"]
    table = Table(title=f"search with the audit trail · N = {args.size:,} · {args.setting} · {len(questions)} queries")
    for column in ("what", "p50 ms", "p95 ms"):
        table.add_column(column, justify="right")
    for name in ("embed", "audit off", "audit on", "audit_write", "audit_write_while_locked"):
        table.add_row(name, f"{results[name]['p50_ms']:.2f}", f"{results[name]['p95_ms']:.2f}")
    console.print(table)
    console.print(
        f"p95 on/off {results['ratio_p95_on_over_off']:.3f} · p50 on/off {results['ratio_p50_on_over_off']:.3f} · "
        f"p95 on/embed {results['ratio_p95_on_over_embed']:.3f} · off/embed {results['ratio_p95_off_over_embed']:.3f}"
        f" · chain ok {verdict.ok} ({verdict.entries} entries) · {time.strftime('%H:%M:%S')}"
    )
    bench.write_json(args.out, results)


if __name__ == "__main__":
    main()
