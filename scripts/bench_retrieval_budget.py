"""Evidence recall against context budget on LoCoMo: dense vs lexical vs hybrid retrieval.

For every question of the LoCoMo file (categories 1-4, with evidence), the question is searched
in a store holding its conversation, the context is assembled within a budget of answer-model
tokens (``retrieval.format_context``), and the question counts as covered at that budget when
*all* its evidence turns are in the context's provenance. No LLM is called. Corpora:

* ``turns``   — single raw turns (evidence windows of size 1);
* ``windows`` — 3-turn windows, stride 1, overlapping windows merged (a turn is paid once);
* ``facts``   — LoCoMo's own ``observation`` facts (each with the turn ids it came from) as
  stand-ins for curated memories, stored as episodes (title = speaker, details = fact).

each searched ``dense`` (MiniLM + hnswlib, the paper), ``lexical`` (BM25 + stemming) and
``hybrid`` (RRF of both), through HybridMemory exactly as the library runs. It also times,
per query, the dense search, the BM25 search and the fusion at the default candidate depth,
and the cost of rebuilding a BM25 index at LoCoMo scale and above.

    python scripts/bench_retrieval_budget.py --out runs/bench_retrieval_budget.json
    python scripts/bench_retrieval_budget.py --conversations 1     # a quick look

Budgets are counted in the tokenizer of ``--tokenizer`` (a models/manifest.yaml name; the
embedded default answer model SmolLM2, whose tokenizer loads from its GGUF in ~8 s).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from hybridmem_local.config import EmbedderConfig, RetrievalConfig, load_config
from hybridmem_local.embedding import build_embedder
from hybridmem_local.eval.locomo import LocomoConversation, load_locomo, normalise_evidence
from hybridmem_local.lexical import LexicalIndex
from hybridmem_local.memory import HybridMemory
from hybridmem_local.retrieval import fuse, format_context
from hybridmem_local.schema import EpisodeDraft

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
MODES = ("dense", "lexical", "hybrid")
CORPORA = {
    "turns": dict(sources=["windows"], window_size=1, window_stride=1),
    "windows": dict(sources=["windows"], window_size=3, window_stride=1),
    "facts": dict(sources=["episodes"]),
}


def load_counter(model: str):
    """``count_tokens`` of a manifest model's tokenizer (GGUF models through transformers)."""
    from transformers import AutoTokenizer

    from hybridmem_local.model_registry import resolve_model

    resolved = resolve_model(model)
    if resolved.path.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(str(resolved.path.parent), gguf_file=resolved.path.name)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))

    @functools.lru_cache(maxsize=None)
    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count_tokens


def observation_facts(raw_sample: dict, conversation: LocomoConversation) -> list[EpisodeDraft]:
    """LoCoMo's per-session ``observation`` facts as episodes citing their evidence turns."""
    turn_ids = {t.turn_id for s in conversation.sessions for t in s.turns}
    dates = {s.session_id.rsplit(":", 1)[1]: s.started_at for s in conversation.sessions}
    facts = []
    for key, by_speaker in raw_sample.get("observation", {}).items():
        session = key.removesuffix("_observation")
        if session not in dates:
            continue
        for speaker, entries in by_speaker.items():
            for fact, evidence in entries:
                raw = [evidence] if isinstance(evidence, str) else list(evidence)
                kept, _ = normalise_evidence(f"{conversation.sample_id}:{key}", raw, turn_ids)
                facts.append(
                    EpisodeDraft(
                        title=speaker, summary=fact, details=fact,
                        timestamp=dates[session].date().isoformat(), source_turn_ids=kept,
                    )
                )
    return facts


def bench_conversation(memory: HybridMemory, conversation: LocomoConversation, budgets, count_tokens, depth, latency):
    """Covered-question counts per (corpus, mode, budget) for one conversation."""
    questions = [q for q in conversation.questions if q.evidence]
    texts = sorted({q.question for q in questions})
    vectors = dict(zip(texts, memory.embedder.embed(texts)))  # one batch: the searches below reuse them
    memory.indexes.embed_query = vectors.__getitem__
    covered: dict[str, dict[str, list[int]]] = {}
    for corpus, settings in CORPORA.items():
        for mode in MODES:
            memory.config.retrieval = RetrievalConfig(
                mode=mode, candidate_depth=depth, context_budget=max(budgets), **settings
            )
            memory.retriever.config = memory.config.retrieval
            counts = [0] * len(budgets)
            for question in questions:
                result = memory.search(question.question, namespace=conversation.namespace)
                for i, budget in enumerate(budgets):
                    context = format_context(result, budget=budget, count_tokens=count_tokens)
                    counts[i] += set(question.evidence) <= set(context.turn_ids)
            covered.setdefault(corpus, {})[mode] = counts
        if corpus != "facts":
            time_fusion(memory, conversation.namespace, questions, vectors, latency)
    return len(questions), covered


def time_fusion(memory: HybridMemory, namespace: str, questions, vectors, latency) -> None:
    """Per-query seconds of each step of hybrid search on the windows, at the default depth."""
    depth = RetrievalConfig().candidate_depth
    dense, lexical = memory.indexes.dense(namespace, "window"), memory.indexes.lexical(namespace, "window")
    for question in questions:
        t0 = time.perf_counter()
        dense_hits = dense.search(vectors[question.question], depth)
        t1 = time.perf_counter()
        lexical_hits = lexical.search(question.question, depth)
        t2 = time.perf_counter()
        fuse(dense_hits, lexical_hits, memory.config.retrieval)
        t3 = time.perf_counter()
        latency["dense_search"].append(t1 - t0)
        latency["bm25_search"].append(t2 - t1)
        latency["rrf"].append(t3 - t2)


def rebuild_costs(all_windows: list[str], per_conversation: int, workdir: Path) -> list[dict]:
    """Seconds to rebuild (tokenize + index) and save a BM25 index of n window texts.

    Sizes: one LoCoMo conversation, all conversations run, and ten times that (repeated texts).
    """
    rows = []
    for n in (per_conversation, len(all_windows), 10 * len(all_windows)):
        texts = (all_windows * (n // len(all_windows) + 1))[:n]
        index = LexicalIndex(workdir / "rebuild", "window", "bench")
        start = time.perf_counter()
        index.build(np.arange(n), texts)
        built = time.perf_counter()
        index.save()
        rows.append({"documents": n, "build_s": built - start, "save_s": time.perf_counter() - built})
        index.delete_files()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--conversations", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--budgets", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct")
    parser.add_argument("--depth", type=int, default=2000, help="candidates per ranking (whole corpus by default)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    console = Console(stderr=True)

    dataset = load_locomo(args.locomo)
    raw_samples = {s["sample_id"]: s for s in json.loads(args.locomo.read_text())}
    conversations = dataset.conversations[: args.conversations]
    count_tokens = load_counter(args.tokenizer)
    embedder = build_embedder(EmbedderConfig(device="cpu"))
    budgets = sorted(args.budgets)

    totals = {c: {m: [0] * len(budgets) for m in MODES} for c in CORPORA}
    n_questions = 0
    latency: dict[str, list[float]] = {"dense_search": [], "bm25_search": [], "rrf": []}
    all_windows: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for conversation in conversations:
            config = load_config(overrides={"embedder.device": "cpu"})
            with HybridMemory.open(Path(tmp) / f"{conversation.sample_id}.db", config, embedder=embedder) as memory:
                memory.ingest(conversation.sessions, curate=False)
                memory.add_memories(conversation.namespace, episodes=observation_facts(raw_samples[conversation.sample_id], conversation))
                n, covered = bench_conversation(memory, conversation, budgets, count_tokens, args.depth, latency)
                all_windows += [w.index_text() for w in memory.indexes.all_windows(conversation.namespace)]
            n_questions += n
            for corpus, by_mode in covered.items():
                for mode, counts in by_mode.items():
                    totals[corpus][mode] = [a + b for a, b in zip(totals[corpus][mode], counts)]
            console.log(f"{conversation.sample_id}: {n} questions, {time.perf_counter() - started:.0f}s")
        rebuild = rebuild_costs(all_windows, len(all_windows) // len(conversations), Path(tmp))

    recall = {c: {m: [round(x / n_questions, 3) for x in counts] for m, counts in by_mode.items()} for c, by_mode in totals.items()}
    ms = {step: {"p50_ms": 1000 * statistics.median(v), "p95_ms": 1000 * float(np.percentile(v, 95))} for step, v in latency.items()}
    report = {
        "locomo": str(args.locomo),
        "conversations": [c.sample_id for c in conversations],
        "questions_with_evidence": n_questions,
        "budgets": budgets,
        "tokenizer": args.tokenizer,
        "embedder": embedder.model_id,
        "evidence_recall": recall,
        "latency_per_query": ms,
        "fusion_depth": RetrievalConfig().candidate_depth,
        "bm25_rebuild": rebuild,
        "seconds": time.perf_counter() - started,
    }

    table = Table(title=f"Evidence recall by context budget ({n_questions} questions, {len(conversations)} conversations)")
    table.add_column("corpus")
    table.add_column("mode")
    for budget in budgets:
        table.add_column(str(budget), justify="right")
    for corpus, by_mode in recall.items():
        for mode, values in by_mode.items():
            table.add_row(corpus, mode, *(f"{v:.3f}" for v in values))
    out = Console()
    out.print(table)
    out.print({k: {s: round(x, 3) for s, x in v.items()} for k, v in ms.items()})
    out.print(rebuild)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
