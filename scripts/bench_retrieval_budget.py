"""Evidence recall against context budget on LoCoMo: dense vs lexical vs hybrid retrieval.

For every question of the LoCoMo file (categories 1-4, with evidence), the question is searched
in a store holding its conversation, the context is assembled within a budget of answer-model
tokens (``answering.context.format_context``), and the question counts as covered at that budget when
*all* its evidence turns are in the context's provenance. No LLM is called. Corpora:

* ``turns``   — single raw turns (evidence windows of size 1);
* ``windows`` — 3-turn windows, stride 1, overlapping windows merged (a turn is paid once);
* ``facts``   — LoCoMo's own ``observation`` facts (each with the turn ids it came from) as
  stand-ins for curated memories, stored as episodes (title = speaker, details = fact).

each searched ``dense`` (MiniLM + hnswlib, the paper), ``lexical`` (BM25 + stemming) and
``hybrid`` (RRF of both), through HybridMemory exactly as the library runs. It also times,
per query, the dense search, the BM25 search and the fusion at the default candidate depth,
and the cost of rebuilding a BM25 index at LoCoMo scale and above.

``--selections`` measures instead what the default retrieval should be (issue #16), all
hybrid except the paper's: the paper's selection (dense, top-k episodes + top-2k tuples, no
budget), memories only (episodes + tuples), windows only, and memories + windows fused in one
ranking at several window weights. The memories are the ``facts`` stand-ins, or with
``--stores`` the memories an LLM curated (the ``stores/`` folder of ``hybridmem eval locomo``;
only questions whose evidence turns are all stored count).

    python scripts/bench_retrieval_budget.py --out runs/bench_retrieval_budget.json
    python scripts/bench_retrieval_budget.py --conversations 1     # a quick look
    python scripts/bench_retrieval_budget.py --selections --out runs/bench_selections.json
    python scripts/bench_retrieval_budget.py --selections --stores runs/eval_vllm_cpu/stores

Budgets are counted in the tokenizer of ``--tokenizer`` (a hybridmem_local/weights/manifest.yaml name; the
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
from collections import Counter
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from hybridmem_local.answering.context import format_context
from hybridmem_local.config import EmbedderConfig, RetrievalConfig, load_config
from hybridmem_local.curation.dedup import content_key
from hybridmem_local.curation.replies import EpisodeReply, TupleReply, episode_problem, tuple_problem
from hybridmem_local.embedding import build_embedder
from hybridmem_local.eval.locomo import LocomoConversation, load_locomo, normalise_evidence
from hybridmem_local.indexes.bm25 import LexicalIndex
from hybridmem_local.memory import HybridMemory
from hybridmem_local.retrieval.retriever import fuse
from hybridmem_local.schema import Episode, EpisodeDraft, RelationalTuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
MODES = ("dense", "lexical", "hybrid")
CORPORA = {
    "turns": dict(sources=["windows"], window_size=1, window_stride=1),
    "windows": dict(sources=["windows"], window_size=3, window_stride=1),
    "facts": dict(sources=["episodes"]),
}
MEMORIES, ALL_SOURCES = ["episodes", "tuples"], ["episodes", "tuples", "windows"]
#: name → (retrieval settings, source weights of the fused context order); the paper's
#: selection has no budget (it is rendered whole), every other one fills each budget.
SELECTIONS = {
    "paper (dense k/2k)": (dict(mode="dense", sources=MEMORIES), None),
    "memories": (dict(sources=MEMORIES), None),
    "windows": (dict(sources=["windows"]), None),
    "fused": (dict(sources=ALL_SOURCES), None),
    "fused, windows x0.8": (dict(sources=ALL_SOURCES), {"windows": 0.8}),
    "fused, windows x1.25": (dict(sources=ALL_SOURCES), {"windows": 1.25}),
}
PAPER = "paper (dense k/2k)"


def load_counter(model: str):
    """``count_tokens`` of a manifest model's tokenizer (GGUF models through transformers)."""
    from transformers import AutoTokenizer

    from hybridmem_local.weights.resolve import resolve_model

    resolved = resolve_model(model)
    if resolved.path.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(str(resolved.path.parent), gguf_file=resolved.path.name)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))

    @functools.cache
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
                        title=speaker,
                        summary=fact,
                        details=fact,
                        timestamp=dates[session].date().isoformat(),
                        source_turn_ids=kept,
                    )
                )
    return facts


def search(memory: HybridMemory, query: str, namespace: str):
    """What an answer is written from: every candidate of each store when a budget is set."""
    config = memory.config.retrieval
    return memory.retriever.search(
        query, namespace, config.k, config.tuple_multiplier * config.k, candidates=config.context_budget is not None
    )


def bench_conversation(memory: HybridMemory, conversation: LocomoConversation, budgets, count_tokens, depth, latency):
    """Covered-question counts per (corpus, mode, budget) for one conversation."""
    questions = [q for q in conversation.questions if q.evidence]
    texts = sorted({q.question for q in questions})
    vectors = dict(zip(texts, memory.embedder.embed(texts), strict=True))  # one batch: the searches below reuse them
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
                result = search(memory, question.question, conversation.namespace)
                for i, budget in enumerate(budgets):
                    context = format_context(result, budget=budget, count_tokens=count_tokens)
                    counts[i] += set(question.evidence) <= set(context.turn_ids)
            covered.setdefault(corpus, {})[mode] = counts
        if corpus != "facts":
            time_fusion(memory, conversation.namespace, questions, vectors, latency)
    return len(questions), covered


def bench_selections(memory: HybridMemory, namespace: str, questions, budgets, count_tokens, depth):
    """Covered-question counts per selection and budget, and the paper selection's tokens."""
    vectors = dict(zip(texts := sorted({q.question for q in questions}), memory.embedder.embed(texts), strict=True))
    memory.indexes.embed_query = vectors.__getitem__
    covered: dict[str, list[int]] = {}
    paper_tokens: list[int] = []
    for name, (settings, weights) in SELECTIONS.items():
        paper = name == PAPER
        memory.config.retrieval = RetrievalConfig(
            candidate_depth=depth, context_budget=None if paper else max(budgets), **settings
        )
        memory.retriever.config = memory.config.retrieval
        counts = [0] * len(budgets)
        for question in questions:
            result = search(memory, question.question, namespace)
            if paper:
                context = format_context(result, count_tokens=count_tokens)
                paper_tokens.append(context.tokens)
                counts = [c + (set(question.evidence) <= set(context.turn_ids)) for c in counts]
                continue
            for i, budget in enumerate(budgets):
                context = format_context(result, budget=budget, count_tokens=count_tokens, source_weights=weights)
                counts[i] += set(question.evidence) <= set(context.turn_ids)
        covered[name] = counts
    return covered, paper_tokens


def run_selections(args, conversations, raw_samples, count_tokens, embedder, budgets, console) -> dict:
    """The selection table on the facts stand-ins, or on curated stores (``--stores``)."""
    totals = {name: [0] * len(budgets) for name in SELECTIONS}
    paper_tokens: list[int] = []
    n_questions = 0
    per_conversation = {}
    stores: dict[str, dict] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for conversation in conversations:
            config = load_config(overrides={"embedder.device": "cpu"})
            if args.stores is not None:
                path = args.stores / f"{conversation.sample_id}.db"
                if not path.exists():
                    continue
            else:
                path = Path(tmp) / f"{conversation.sample_id}.db"
            with HybridMemory.open(path, config, embedder=embedder) as memory:
                if args.stores is None:
                    memory.ingest(conversation.sessions, curate=False)
                    memory.add_memories(
                        conversation.namespace,
                        episodes=observation_facts(raw_samples[conversation.sample_id], conversation),
                    )
                if args.stores is not None:
                    stores[conversation.sample_id] = store_summary(memory, conversation.namespace)
                stored = {t.turn_id for w in memory.indexes.all_windows(conversation.namespace) for t in w.turns}
                questions = [q for q in conversation.questions if q.evidence and set(q.evidence) <= stored]
                if not questions:
                    continue
                covered, tokens = bench_selections(
                    memory, conversation.namespace, questions, budgets, count_tokens, args.depth
                )
            n_questions += len(questions)
            paper_tokens += tokens
            per_conversation[conversation.sample_id] = {"questions": len(questions), "covered": covered}
            for name, counts in covered.items():
                totals[name] = [a + b for a, b in zip(totals[name], counts, strict=True)]
            console.log(f"{conversation.sample_id}: {len(questions)} questions, {time.perf_counter() - started:.0f}s")
    if not n_questions:
        raise SystemExit("no question has all its evidence turns stored")
    return {
        "memories": str(args.stores) if args.stores else "observation facts (stand-ins)",
        "questions_with_evidence": n_questions,
        "evidence_recall": {name: [round(c / n_questions, 3) for c in counts] for name, counts in totals.items()},
        "paper_selection_tokens": {
            "mean": round(statistics.mean(paper_tokens)),
            "p95": int(np.percentile(paper_tokens, 95)),
        },
        "per_conversation": per_conversation,
        **({"stores": stores} if stores else {}),
        "seconds": round(time.perf_counter() - started),
    }


def store_summary(memory: HybridMemory, namespace: str) -> dict:
    """What a curated store holds: sessions by curation status, active memories by kind and by
    how their source turns were obtained (``provenance``: cited by the model, aligned, none),
    the repeats the duplicate guard kept out (its ``duplicate`` events), and what today's
    write-time checks would keep out of it (:func:`recheck`: the store may predate them)."""
    conn = memory.store.conn
    sessions = dict(
        conn.execute(
            "SELECT curation_status, count(*) FROM sessions WHERE namespace = ? GROUP BY 1", (namespace,)
        ).fetchall()
    )
    memories = memory.store.memories.select(namespace)
    repeats = conn.execute(
        "SELECT count(*) FROM events WHERE namespace = ? AND action = 'duplicate'", (namespace,)
    ).fetchone()[0]
    return {
        "sessions": sessions,
        "memories": dict(Counter(m.kind for m in memories)),
        "provenance": dict(Counter(m.provenance or "none" for m in memories)),
        "repeats_not_stored": repeats,
        "kept_out_by_todays_checks": recheck(memories),
    }


def recheck(memories: list[Episode | RelationalTuple]) -> dict[str, int]:
    """Active rows that curation's content checks would now leave out (``no_content``) and,
    of the rest, exact repeats (``dedup.content_key``) of an earlier row of the same kind and
    session (``repeats``). Near repeats need the embedder and are not recounted."""
    seen: set[tuple[str, str | None, str]] = set()
    kept_out = Counter(no_content=0, repeats=0)
    for memory in sorted(memories, key=lambda m: m.id):
        if isinstance(memory, Episode):
            problem = episode_problem(
                EpisodeReply(
                    **memory.model_dump(include={"title", "summary", "details", "timestamp", "source_turn_ids"})
                )
            )
        else:
            problem = tuple_problem(
                TupleReply(
                    **memory.model_dump(
                        include={"entity", "relation", "object", "timestamp", "context", "source_turn_ids"}
                    )
                )
            )
        key = (memory.kind, memory.source_session_id, content_key(memory))
        if problem is not None:
            kept_out["no_content"] += 1
        elif key in seen:
            kept_out["repeats"] += 1
        else:
            seen.add(key)
    return dict(kept_out)


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
    parser.add_argument("--selections", action="store_true", help="the default-retrieval table (see above)")
    parser.add_argument(
        "--stores", type=Path, default=None, help="with --selections: folder of curated <sample_id>.db stores"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    console = Console(stderr=True)

    dataset = load_locomo(args.locomo)
    raw_samples = {s["sample_id"]: s for s in json.loads(args.locomo.read_text())}
    conversations = dataset.conversations[: args.conversations]
    count_tokens = load_counter(args.tokenizer)
    embedder = build_embedder(EmbedderConfig(device="cpu"))
    budgets = sorted(args.budgets)
    if args.selections:
        report = run_selections(args, conversations, raw_samples, count_tokens, embedder, budgets, console)
        report.update(locomo=str(args.locomo), budgets=budgets, tokenizer=args.tokenizer, embedder=embedder.model_id)
        table = Table(
            title=f"Evidence recall by context budget, {report['memories']} "
            f"({report['questions_with_evidence']} questions)"
        )
        table.add_column("selection")
        for budget in budgets:
            table.add_column(str(budget), justify="right")
        for name, values in report["evidence_recall"].items():
            table.add_row(name, *(f"{v:.3f}" for v in values))
        Console().print(table)
        Console().print(f"paper selection tokens: {report['paper_selection_tokens']}")
        for sample_id, summary in report.get("stores", {}).items():
            Console().print(f"{sample_id}: {summary}")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2))
        return 0

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
                memory.add_memories(
                    conversation.namespace,
                    episodes=observation_facts(raw_samples[conversation.sample_id], conversation),
                )
                n, covered = bench_conversation(memory, conversation, budgets, count_tokens, args.depth, latency)
                all_windows += [w.index_text() for w in memory.indexes.all_windows(conversation.namespace)]
            n_questions += n
            for corpus, by_mode in covered.items():
                for mode, counts in by_mode.items():
                    totals[corpus][mode] = [a + b for a, b in zip(totals[corpus][mode], counts, strict=True)]
            console.log(f"{conversation.sample_id}: {n} questions, {time.perf_counter() - started:.0f}s")
        rebuild = rebuild_costs(all_windows, len(all_windows) // len(conversations), Path(tmp))

    recall = {
        c: {m: [round(x / n_questions, 3) for x in counts] for m, counts in by_mode.items()}
        for c, by_mode in totals.items()
    }
    ms = {
        step: {"p50_ms": 1000 * statistics.median(v), "p95_ms": 1000 * float(np.percentile(v, 95))}
        for step, v in latency.items()
    }
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

    table = Table(
        title=f"Evidence recall by context budget ({n_questions} questions, {len(conversations)} conversations)"
    )
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
