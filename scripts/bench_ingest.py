"""Ingest cost: memories/s for store + embed + index, and LLM calls per curated session.

1. **Throughput** (no LLM). Each LoCoMo dev session is written with
   ``HybridMemory.add_memories(..., session=session)`` — turns, memories, their vectors and the
   session row in one transaction, the session's texts embedded in one batch, loaded hnswlib
   indexes updated — with curated stand-ins as its memories: the session's ``session_summary``
   as an episode and its ``observation`` facts as tuples (speaker, "observed", fact, citing the
   fact's evidence turns). The reference, timed in the same run and paired session by session
   (alternating which goes first), is MiniLM embedding exactly the same texts in the same
   batch: the ratio says what storing and indexing add. On the store it built, every question
   of the conversations is searched (warm indexes, the default hybrid retrieval, query
   embedding included: p50/p95), and each namespace's indexes are rebuilt from SQLite
   (``rebuild_indexes`` from cached vectors, plus the BM25 rebuild of the first search).
2. **LLM calls per session.** Session-level curation sends one request per *window* of a
   session (``Curator.windows``: whole turns that fit the context with the prompt and the
   reply), counted here without running the LLM, against the turns per session — the calls a
   turn-by-turn system makes (mem0 and A-Mem make at least one LLM call per turn). Counted with
   the SmolLM2 tokenizer at the embedded default (``LLMConfig``'s context and reply
   reservation) and, as a proxy for Qwen3's tokenizer, at the vLLM configs' 30720-token context.

    python scripts/bench_ingest.py --out runs/bench_ingest.json
    python scripts/bench_ingest.py --conversations 2            # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.table import Table

# scripts/ is not a package: the imports below (noqa: E402) need its path entry first.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import DEFAULT_LOCOMO, console, load_embedder, machine, set_threads, summary, timed, write_json  # noqa: E402

from hybridmem_local.config import CurationConfig, LLMConfig, load_config  # noqa: E402
from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft  # noqa: E402

# --------------------------------------------------------------------------- curated stand-ins


def stand_in_memories(raw_sample: dict, session: Session) -> tuple[list[EpisodeDraft], list[TupleDraft]]:
    """LoCoMo's own summary and observations of one session, as episodes and tuples."""
    number = session.session_id.rsplit("_", 1)[-1]
    day = f"{session.started_at:%Y-%m-%d}"
    turn_ids = {t.turn_id for t in session.turns}
    summary = raw_sample.get("session_summary", {}).get(f"session_{number}_summary")
    episodes = []
    if summary:
        episodes.append(
            EpisodeDraft(
                title=f"Session {number}",
                summary=summary.split(". ")[0],
                details=summary,
                timestamp=day,
                source_turn_ids=sorted(turn_ids),
            )
        )
    tuples = []
    for speaker, facts in raw_sample.get("observation", {}).get(f"session_{number}_observation", {}).items():
        for fact, evidence in facts:
            cited = [e.strip() for e in str(evidence).replace(";", ",").split(",") if e.strip() in turn_ids]
            tuples.append(
                TupleDraft(
                    entity=speaker, relation="observed", object=fact, timestamp=day, context="", source_turn_ids=cited
                )
            )
    return episodes, tuples


class TimedEmbedder:
    """The real embedder, with the seconds spent in ``embed`` added up (no other change)."""

    def __init__(self, inner):
        self.inner, self.model_id, self.dimension = inner, inner.model_id, inner.dimension
        self.seconds, self.texts, self.batches = 0.0, 0, 0

    def embed(self, texts):
        start = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.seconds += time.perf_counter() - start
            self.texts += len(texts)
            self.batches += 1 if texts else 0


def bench_throughput(embedder, work: list[tuple[Session, list, list]], questions: dict[str, list[str]]) -> dict:
    """Ingest every session; right before or after each one (alternating, so drift hits both
    alike), embed the same texts in the same batch alone: the paired reference. Then, on the
    ingested store, search every question of its conversation (default config: hybrid) and
    rebuild every namespace's indexes from SQLite."""
    from hybridmem_local.memory import HybridMemory
    from hybridmem_local.memory.writes import as_stored

    timed_embedder = TimedEmbedder(embedder)
    ingest_s, reference_s = [], []
    with (
        tempfile.TemporaryDirectory() as folder,
        HybridMemory.open(Path(folder) / "m.db", load_config(), embedder=timed_embedder) as memory,
    ):
        for namespace in sorted({s.namespace for s, _, _ in work}):
            memory.search("load the indexes", namespace=namespace)  # indexes then follow each write
        timed_embedder.seconds = timed_embedder.texts = timed_embedder.batches = 0
        for i, (session, episodes, tuples) in enumerate(work):
            texts = sorted({as_stored(m, session.namespace).index_text() for m in [*episodes, *tuples]})
            steps = [
                (ingest_s, memory.add_memories, (session.namespace, episodes, tuples, session)),
                (reference_s, embedder.embed, (texts,)),
            ]
            for samples, fn, args in steps if i % 2 == 0 else steps[::-1]:
                start = time.perf_counter()
                fn(*args)
                samples.append(time.perf_counter() - start)
        start = time.perf_counter()
        memory.flush()
        save_s = time.perf_counter() - start
        embed_s = timed_embedder.seconds  # searches below embed too
        counts = memory.store.counts()
        search = summary(_search_seconds(memory, questions))
        # The first search after a rebuild also rebuilds BM25 (and embeds its query).
        rebuild_s = {
            namespace: timed(_rebuild_and_search, memory, namespace, texts[0])[0]
            for namespace, texts in questions.items()
        }
    memories = sum(len(e) + len(t) for _, e, t in work)
    total, reference = sum(ingest_s), sum(reference_s)
    return {
        "sessions": len(work),
        "turns": counts["turns"],
        "memories": memories,
        "ingest_s": total,
        "embed_within_ingest_s": embed_s,
        "store_and_index_s": total - embed_s,
        "index_save_s": save_s,
        "memories_per_s": memories / total,
        "sessions_per_s": len(work) / total,
        "session_p50_ms": statistics.median(ingest_s) * 1000,
        "store_and_index_ms_per_session": 1000 * (total - embed_s) / len(work),
        "embed_only_s": reference,
        "embed_only_memories_per_s": memories / reference,
        "ingest_over_embed_only": total / reference,
        "search_queries": search["n"],
        "search_p50_ms": search["p50_ms"],
        "search_p95_ms": search["p95_ms"],
        "rebuild_s_total": sum(rebuild_s.values()),
        "rebuild_s_per_namespace": rebuild_s,
    }


def _search_seconds(memory, questions: dict[str, list[str]]) -> list[float]:
    """Seconds of ``search`` (query embedding included) for every question, indexes warm."""
    seconds = []
    for namespace, texts in questions.items():
        memory.search(texts[0], namespace=namespace)
        seconds += [timed(memory.search, text, namespace)[0] for text in texts]
    return seconds


def _rebuild_and_search(memory, namespace: str, question: str) -> None:
    memory.rebuild_indexes(namespace)
    memory.search(question, namespace=namespace)


# --------------------------------------------------------------------------- LLM calls per session


def token_counter_llm(llm_config: LLMConfig):
    """The embedded default LLM (only its tokenizer is used: ``Curator.windows`` runs no generation)."""
    from hybridmem_local.llm import build_llm

    return build_llm(llm_config)


def bench_windows(sessions: list[Session], llm, llm_config: LLMConfig) -> dict:
    from hybridmem_local.curation.curator import Curator

    curator = Curator(llm, llm_config, CurationConfig())
    windows = [len(curator.windows(session)) for session in sessions]
    turns = [len(session.turns) for session in sessions]
    return {
        "context_tokens": llm_config.context_tokens,
        "max_new_tokens": llm_config.max_new_tokens,
        "turn_budget_tokens": curator.turn_budget,
        "sessions": len(sessions),
        "calls_session_level": sum(windows),
        "calls_turn_by_turn_at_least": sum(turns),
        "windows_per_session_mean": statistics.fmean(windows),
        "windows_per_session_max": max(windows),
        "turns_per_session_mean": statistics.fmean(turns),
        "turns_per_session_max": max(turns),
        "calls_ratio": sum(windows) / sum(turns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--conversations", type=int, default=None, help="only the first N conversations")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (see bench_search.py)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import json

    from hybridmem_local.eval.locomo import load_locomo

    info = machine()
    set_threads(args.threads)
    dataset = load_locomo(args.locomo)
    raw = {sample["sample_id"]: sample for sample in json.loads(args.locomo.read_text())}
    conversations = dataset.conversations[: args.conversations]
    work = [(s, *stand_in_memories(raw[c.sample_id], s)) for c in conversations for s in c.sessions]
    sessions = [s for s, _, _ in work]

    default = LLMConfig()
    llm = token_counter_llm(default)
    calls = {
        f"embedded default (SmolLM2, {default.context_tokens} ctx)": bench_windows(sessions, llm, default),
        "vLLM config context (30720 ctx; SmolLM2 tokenizer as proxy)": bench_windows(
            sessions, llm, load_config(Path(__file__).resolve().parents[1] / "configs" / "vllm-offline.yaml").llm
        ),
    }

    embedder = load_embedder()
    embedder.embed(["warm up"])
    questions = {c.namespace: [q.question for q in c.questions] for c in conversations}
    throughput = bench_throughput(embedder, work, questions)
    info["load_average_at_end"] = os.getloadavg()
    results = {
        "machine": info,
        "threads": args.threads,
        "conversations": [c.sample_id for c in conversations],
        "throughput": throughput,
        "llm_calls": calls,
    }

    t = Table(
        title=f"Ingest without the LLM · {throughput['sessions']} LoCoMo sessions · {throughput['memories']} "
        f"stand-in memories · {args.threads} torch thread(s)"
    )
    for column in (
        "memories/s",
        "sessions/s",
        "session p50 ms",
        "embed s",
        "store+index s",
        "store+index ms/session",
        "index save s",
        "embed-only memories/s",
        "ingest / embed-only",
    ):
        t.add_column(column, justify="right")
    r = throughput
    t.add_row(
        f"{r['memories_per_s']:.1f}",
        f"{r['sessions_per_s']:.2f}",
        f"{r['session_p50_ms']:.0f}",
        f"{r['embed_within_ingest_s']:.1f}",
        f"{r['store_and_index_s']:.1f}",
        f"{r['store_and_index_ms_per_session']:.1f}",
        f"{r['index_save_s']:.2f}",
        f"{r['embed_only_memories_per_s']:.1f}",
        f"{r['ingest_over_embed_only']:.2f}×",
    )
    console.print(t)
    q = Table(
        title=f"On the ingested store: search ({r['search_queries']} LoCoMo questions, hybrid, warm indexes) "
        "and index rebuild from SQLite"
    )
    for column in (
        "search p50 ms",
        "search p95 ms",
        "rebuild s (all namespaces, hnswlib + BM25)",
        "rebuild s per namespace",
    ):
        q.add_column(column, justify="right")
    q.add_row(
        f"{r['search_p50_ms']:.1f}",
        f"{r['search_p95_ms']:.1f}",
        f"{r['rebuild_s_total']:.2f}",
        f"{statistics.fmean(r['rebuild_s_per_namespace'].values()):.2f}",
    )
    console.print(q)
    c = Table(title="LLM calls to curate the LoCoMo dev sessions: session-level windows vs one per turn")
    for column in (
        "setting",
        "turn budget",
        "sessions",
        "calls (windows)",
        "calls turn-by-turn ≥",
        "windows/session",
        "turns/session",
        "ratio",
    ):
        c.add_column(column, justify="right")
    for name, w in calls.items():
        c.add_row(
            name,
            str(w["turn_budget_tokens"]),
            str(w["sessions"]),
            str(w["calls_session_level"]),
            str(w["calls_turn_by_turn_at_least"]),
            f"{w['windows_per_session_mean']:.2f} (max {w['windows_per_session_max']})",
            f"{w['turns_per_session_mean']:.1f} (max {w['turns_per_session_max']})",
            f"{w['calls_ratio']:.3f}",
        )
    console.print(c)
    write_json(args.out, results)


if __name__ == "__main__":
    main()
