"""Curation quality with the llama.cpp levers off against the study's curation with them on.

Issue #32 item 5 asks that the levers (the AVX-512 build, kept prefixes, 4 sequences,
jump-forward) leave the curated memories' evidence recall no lower than today's. The
benchmark's 20 questions (docs/benchmarks.md §14) cannot say; this pairs more of them:

- **levers on**: the memories the study curated (configs/paper.yaml, the default levers),
  read from a shard's committed checkpoint (``docs/results/locomo-study/shards/<conv>/memories``),
  so that side needs no LLM call;
- **today**: the first ``--sessions`` sessions of the same conversation curated again here with
  the same config and the levers off (one sequence, every prompt read anew, no jump-forward,
  the portable build), with no call cache.

A question counts when every evidence turn of it lies in those sessions (categories 1-4); it
is covered when the memories' source turns hold all of its evidence. Prints and writes
(``--out``) both recalls with Wilson intervals, their paired difference with the paired
bootstrap, the rows per question, the CPU model and the load average.

    PYTHONPATH=$PWD .venv/bin/python scripts/measure_curation_parity.py --sessions 29 --threads 2 \
        --out docs/results/curation_parity.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_llm_throughput import SETTINGS, cpu_model  # noqa: E402  (scripts/ is not a package)
from bench_vllm_curation import DEFAULT_LOCOMO  # noqa: E402

from hybridmem_local.eval.locomo import LocomoQuestion  # noqa: E402
from hybridmem_local.eval.metrics import evidence_recall, paired_difference, wilson_interval  # noqa: E402
from hybridmem_local.llm.cpu_kernels import LIB_PATH_ENV, package_lib_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STUDY_SHARDS = REPO / "docs/results/locomo-study/shards"
CATEGORIES = (1, 2, 3, 4)


def checkpoint_turns(path: Path, session_ids: set[str]) -> tuple[set[str], int]:
    """The source turns of a checkpoint's memories from ``session_ids``, and how many memories."""
    turns: set[str] = set()
    memories = 0
    with path.open(encoding="utf-8") as rows:
        for line in rows:
            row = json.loads(line)
            if row["type"] == "memory" and row["source_session_id"] in session_ids:
                memories += 1
                turns.update(row["source_turn_ids"])
    if not memories:
        raise SystemExit(f"{path} holds no memory of the sessions {sorted(session_ids)}")
    return turns, memories


def covered_questions(questions: Iterable[LocomoQuestion], turn_ids: set[str]) -> list[LocomoQuestion]:
    """The questions of categories 1-4 whose evidence lies wholly in ``turn_ids``."""
    return [
        q
        for q in questions
        if q.category in CATEGORIES and q.evidence and all(turn_id in turn_ids for turn_id in q.evidence)
    ]


def parity(questions: Sequence[LocomoQuestion], today: set[str], levers_on: set[str]) -> dict:
    """Both recalls over ``questions``, their paired difference (levers on − today) and the rows."""
    rows = [
        {
            "question_id": q.question_id,
            "category": q.category,
            "today": evidence_recall(today, q.evidence),
            "levers_on": evidence_recall(levers_on, q.evidence),
        }
        for q in questions
    ]

    def recall(side: str) -> dict:
        hits = sum(bool(row[side]) for row in rows)
        return {"covered": hits, "of": len(rows), "recall": hits / len(rows), "ci95": wilson_interval(hits, len(rows))}

    difference = paired_difference([row["levers_on"] for row in rows], [row["today"] for row in rows])
    return {
        "today": recall("today"),
        "levers_on": recall("levers_on"),
        "difference": {"value": difference.difference, "ci95": difference.ci95},
        "rows": rows,
    }


def curate_today(sessions, config_path: Path, threads: int) -> tuple[set[str], int, float]:
    """The sessions curated with the levers off: (source turns, memories, seconds)."""
    from hybridmem_local.config import load_config
    from hybridmem_local.curation.curator import Curator
    from hybridmem_local.embedding import build_embedder
    from hybridmem_local.llm import build_llm
    from hybridmem_local.weights.offline import enforce_offline

    enforce_offline()
    levers, _portable = SETTINGS["today"]
    os.environ[LIB_PATH_ENV] = str(package_lib_dir())  # wins over the build chosen by CPU flags
    config = load_config(config_path, {**levers, "llm.n_threads": threads})
    embedder = build_embedder(config.embedder)
    llm = build_llm(config.llm)  # no call cache: every reply is generated
    try:
        started = time.perf_counter()
        outcomes = Curator(llm, config.llm, config.curation, embed=embedder.embed).curate(sessions)
        seconds = time.perf_counter() - started
    finally:
        llm.close()
    memories = [m for o in outcomes if o.result for m in [*o.result.episodes, *o.result.tuples]]
    return {t for m in memories for t in m.source_turn_ids}, len(memories), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--conversation", default="conv-42", help="a study shard with a memories checkpoint")
    parser.add_argument("--sessions", type=int, default=12, help="its first N sessions")
    parser.add_argument("--config", type=Path, default=REPO / "configs/paper.yaml", help="the study's config")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.locomo.exists():
        raise SystemExit(f"LoCoMo data not found at {args.locomo}")
    from hybridmem_local.eval.locomo import load_locomo

    conversation = next((c for c in load_locomo(args.locomo).conversations if c.sample_id == args.conversation), None)
    if conversation is None:
        raise SystemExit(f"{args.locomo} has no conversation {args.conversation}")
    sessions = conversation.sessions[: args.sessions]
    session_ids = {s.session_id for s in sessions}
    questions = covered_questions(conversation.questions, {t.turn_id for s in sessions for t in s.turns})
    checkpoint = STUDY_SHARDS / args.conversation / "memories" / f"{args.conversation}.jsonl"
    levers_on, levers_on_memories = checkpoint_turns(checkpoint, session_ids)

    load_before = os.getloadavg()
    today, today_memories, seconds = curate_today(sessions, args.config, args.threads)
    result = {
        "cpu": cpu_model(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "conversation": args.conversation,
        "sessions": len(sessions),
        "threads": args.threads,
        "today_curate_s": round(seconds, 1),
        "today_sessions_per_min": round(len(sessions) / seconds * 60, 2),
        "memories": {"today": today_memories, "levers_on": levers_on_memories},
        "command": " ".join(sys.argv),
        **parity(questions, today, levers_on),
    }
    low, high = result["difference"]["ci95"]
    print(
        f"{args.conversation}, first {len(sessions)} sessions, {len(questions)} questions ({result['cpu']}): "
        f"evidence recall today {result['today']['recall']:.1%} ({today_memories} memories), "
        f"levers on {result['levers_on']['recall']:.1%} ({levers_on_memories} memories); "
        f"levers on − today {100 * result['difference']['value']:+.1f} points ({100 * low:+.1f} to {100 * high:+.1f})"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
