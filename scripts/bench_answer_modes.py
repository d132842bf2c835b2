"""Answer modes and evidence turns on LoCoMo: F1 and evidence recall of SmolLM2's answers.

Four variants of ``answering`` (issue #16 items 4 and 5): ``mode`` json (constrained
``{answer, cited_memory_ids}``) or text (a short plain answer, citations derived by alignment),
each with ``evidence_turns`` off or on (every memory in the context brings its source turns,
paid from the same budget). The same questions, the same store and the same retrieval for all:

* questions: the first ``--questions`` of each conversation with gold evidence (categories 1-4);
* store: LoCoMo's ``observation`` facts as stand-ins for well-curated memories (episodes citing
  their evidence turns; ``bench_retrieval_budget.observation_facts``) plus the raw turns;
* retrieval: hybrid over [episodes, tuples, windows], a ``--budget``-token context (SmolLM2
  tokens), assembled by the library (``HybridMemory.answer_many``, as every caller answers).

Per variant: F1 (``eval.metrics.f1_mem0``, the runner's ``f1``; and LoCoMo's official F1),
evidence recall (share of questions whose gold evidence turns are all in the context's
provenance, ``RenderedContext.turn_ids``), evidence shown (all gold turns shown as raw text),
cited recall (all gold turns among the cited memories' source turns), and tokens per answer.

    flock /tmp/heavy.lock .venv/bin/python scripts/bench_answer_modes.py --out runs/bench_answer_modes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

# scripts/ is not a package: the imports below (noqa: E402) need its path entry first.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_retrieval_budget import observation_facts  # noqa: E402

from hybridmem_local.answering.context import format_context  # noqa: E402
from hybridmem_local.config import AnsweringConfig, EmbedderConfig, load_config  # noqa: E402
from hybridmem_local.embedding import build_embedder  # noqa: E402
from hybridmem_local.eval import metrics  # noqa: E402
from hybridmem_local.eval.benchmarks import load_benchmark  # noqa: E402
from hybridmem_local.eval.locomo import load_locomo  # noqa: E402
from hybridmem_local.eval.options import RunOptions  # noqa: E402
from hybridmem_local.llm import build_llm  # noqa: E402
from hybridmem_local.memory import HybridMemory  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev8.json"
#: The two smallest dev conversations (369 and 419 turns).
DEFAULT_CONVERSATIONS = ["conv-30", "conv-26"]
VARIANTS = {
    "json-off": ("json", False),
    "json-on": ("json", True),
    "text-off": ("text", False),
    "text-on": ("text", True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--conversations", nargs="+", default=DEFAULT_CONVERSATIONS)
    parser.add_argument("--questions", type=int, default=20, help="first N questions with evidence per conversation")
    parser.add_argument("--budget", type=int, default=2048, help="context budget in answer-model tokens")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        default=list(VARIANTS),
        help="mode-evidence turns; SmolLM2 on 2 cores answers 3-4 questions a minute",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="print the table of earlier --out files (runs split by conversation or variant) instead",
    )
    args = parser.parse_args(argv)
    if args.merge:
        reports = [json.loads(path.read_text()) for path in args.merge]
        rows = [row for report in reports for row in report["questions"]]
        seconds = {}
        for report in reports:
            for name, values in report["summary"].items():
                seconds[name] = seconds.get(name, 0.0) + values["seconds_per_answer"] * values["questions"]
        return report_and_table(
            args, rows, seconds, reports[0]["budget"], {k: reports[0][k] for k in ("llm", "embedder", "retrieval")}
        )
    console = Console(stderr=True)

    raw_samples = {s["sample_id"]: s for s in json.loads(args.locomo.read_text())}
    locomo = {c.sample_id: c for c in load_locomo(args.locomo).conversations}
    config = load_config(
        overrides={
            "embedder.device": "cpu",
            "retrieval.sources": ["episodes", "tuples", "windows"],
            "retrieval.context_budget": args.budget,
            "llm.n_threads": args.threads,
        }
    )
    embedder = build_embedder(EmbedderConfig(device="cpu"))
    llm = build_llm(config.llm)  # no call cache: every variant's answers are generated
    started = time.perf_counter()
    rows: list[dict] = []
    seconds = {name: 0.0 for name in args.variants}
    with (
        tempfile.TemporaryDirectory() as tmp,
        HybridMemory.open(Path(tmp) / "bench.db", config, embedder=embedder, llm=llm) as memory,
    ):
        options = RunOptions(benchmark="locomo", data=args.locomo, out=Path(tmp), conversations=args.conversations)
        for conversation in load_benchmark(options).conversations:
            questions = [q for q in conversation.questions if q.evidence][: args.questions]
            namespace = conversation.namespace
            memory.ingest(conversation.sessions, curate=False)
            facts = observation_facts(raw_samples[conversation.conversation_id], locomo[conversation.conversation_id])
            memory.add_memories(namespace, episodes=facts)
            for name in args.variants:
                mode, evidence_turns = VARIANTS[name]
                memory.config.answering = AnsweringConfig(mode=mode, evidence_turns=evidence_turns)
                began = time.perf_counter()
                answers = memory.answer_many(
                    [q.question for q in questions],
                    namespace=namespace,
                    question_dates=[q.question_date for q in questions],
                )
                seconds[name] += time.perf_counter() - began
                for question, answer in zip(questions, answers, strict=True):
                    # The same context again (deterministic), for what it shows: raw turns and provenance.
                    context = format_context(
                        memory.answer_search(question.question, namespace=namespace),
                        budget=args.budget,
                        count_tokens=llm.count_tokens,
                    )
                    if context.text != answer.context_text:
                        raise RuntimeError(f"{question.question_id}: the re-rendered context differs from the answer's")
                    shown = {t for turns in context.window_turns.values() for t in turns}
                    rows.append(
                        {
                            "variant": name,
                            "conversation": conversation.conversation_id,
                            "question_id": question.question_id,
                            "category": question.category,
                            "question": question.question,
                            "gold": question.gold,
                            "evidence": question.evidence,
                            "prediction": answer.answer,
                            "error": answer.error,
                            "citations": answer.citations,
                            "cited_turn_ids": answer.cited_turn_ids,
                            "f1": metrics.f1_mem0(answer.answer, question.gold or ""),
                            "f1_official": metrics.f1_official(
                                answer.answer, question.gold or "", question.category_number
                            ),
                            "evidence_recall": metrics.evidence_recall(context.turn_ids, question.evidence),
                            "evidence_shown": metrics.evidence_recall(shown, question.evidence),
                            "cited_recall": metrics.evidence_recall(answer.cited_turn_ids, question.evidence),
                            "context_tokens": context.tokens,
                            "memories_shown": len(context.short_ids),
                            "turns_shown": len(shown),
                            "prompt_tokens": answer.prompt_tokens,
                            "completion_tokens": answer.completion_tokens,
                        }
                    )
                console.log(
                    f"{conversation.conversation_id} {name}: {len(answers)} answers, "
                    f"{time.perf_counter() - started:.0f}s"
                )
    setup = {"llm": llm.model_id, "embedder": embedder.model_id, "retrieval": config.retrieval.model_dump()}
    return report_and_table(args, rows, seconds, args.budget, setup)


def report_and_table(args, rows: list[dict], seconds: dict[str, float], budget: int, setup: dict) -> int:
    names = [name for name in VARIANTS if name in seconds]
    summary = {name: summarise([r for r in rows if r["variant"] == name], seconds[name]) for name in names}
    questions = len({(r["conversation"], r["question_id"]) for r in rows})
    table = Table(title=f"Answer modes x evidence turns: SmolLM2, {questions} LoCoMo questions, {budget}-token context")
    columns = [
        ("F1", "f1"),
        ("F1 official", "f1_official"),
        ("evidence recall", "evidence_recall"),
        ("evidence shown", "evidence_shown"),
        ("cited recall", "cited_recall"),
        ("no answer", "errors"),
        ("I don't know", "abstained"),
        ("memories shown", "memories_shown"),
        ("turns shown", "turns_shown"),
        ("prompt tok", "prompt_tokens"),
        ("completion tok", "completion_tokens"),
        ("s/answer", "seconds_per_answer"),
    ]
    table.add_column("variant")
    for title, _ in columns:
        table.add_column(title, justify="right")
    for name, values in summary.items():
        table.add_row(name, *(_cell(values[key]) for _, key in columns))
    Console(width=240).print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "locomo": str(args.locomo),
            "conversations": sorted({r["conversation"] for r in rows}),
            "questions_per_conversation": args.questions,
            "budget": budget,
            **setup,
            "summary": summary,
            "questions": rows,
        }
        args.out.write_text(json.dumps(report, indent=2))
    return 0


def summarise(rows: list[dict], seconds: float) -> dict:
    def mean(key: str) -> float:
        return round(statistics.mean(float(r[key]) for r in rows), 3)

    return {
        "questions": len(rows),
        **{key: mean(key) for key in ("f1", "f1_official", "evidence_recall", "evidence_shown", "cited_recall")},
        **{
            key: round(statistics.mean(r[key] for r in rows), 1)
            for key in ("memories_shown", "turns_shown", "context_tokens", "prompt_tokens", "completion_tokens")
        },
        "errors": sum(1 for r in rows if r["error"]),
        "abstained": sum(1 for r in rows if r["prediction"].strip().lower().startswith("i don")),
        "seconds_per_answer": round(seconds / len(rows), 2),
    }


def _cell(value: float | int) -> str:
    return f"{value:.3f}" if isinstance(value, float) and value <= 1 else str(value)


if __name__ == "__main__":
    sys.exit(main())
