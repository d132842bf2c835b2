"""The embedded LLM's throughput with each llama.cpp lever on and off, as ratios in one run.

Settings, each in a fresh child process one after another (so each peak RSS is its own):

- ``today``: one sequence at a time, every prompt read anew, no jump-forward, the portable
  AVX2 build (the backend before issue #32);
- ``best-build``, ``prefix``, ``sequences``, ``jump-forward``, ``draft``: today's with that one
  lever on (the build chosen for this CPU; prefixes kept; 4 sequences; forced JSON tokens in
  one step; 4 prompt-lookup guesses per step);
- ``all-but-draft`` and ``all``: every lever, without and with the drafts.

Each setting runs the same work on the same inputs, with no call cache:

- **curation**: the first ``--sessions`` sessions of the LoCoMo dev conversations (one per
  conversation, in file order), curated in one batch with ``Curator.curate`` as ``ingest``
  does: sessions/min, and the curated memories' evidence recall (questions whose evidence all
  lies in a curated session, covered by the memories' source turns) as the quality check;
- **answers**: a store holding conversation ``--conversation`` raw (queue mode: the default
  retrieval shows its evidence windows, to the default 2,048-token budget): ``--questions``
  questions answered one at a time with ``answer`` (p50 latency, answers/min), then as many
  other questions in one ``answer_many`` call (answers/min).

Prints and writes (``--out``) a JSON report with the CPU model and the load average before
each setting, and a table of ratios against ``today``.

    .venv/bin/python scripts/bench_llm_throughput.py --out docs/results/bench_llm_throughput.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vllm_curation import DEFAULT_LOCOMO, PeakRSS  # noqa: E402  (scripts/ is not a package)

from hybridmem_local.llm.cpu_kernels import LIB_PATH_ENV, package_lib_dir  # noqa: E402

#: Today's setting (the backend before issue #32): one sequence, every prompt read anew, no
#: jump-forward, no drafts, on the portable AVX2 build.
TODAY = {"llm.max_num_seqs": 1, "llm.keep_prefix": False, "llm.jump_forward": False, "llm.draft_tokens": 0}
ALL = {"llm.max_num_seqs": 4, "llm.keep_prefix": True, "llm.jump_forward": True, "llm.draft_tokens": 4}
#: name -> (config overrides, llama.cpp build: "portable" or "best" for this CPU)
SETTINGS: dict[str, tuple[dict, str]] = {
    "today": (TODAY, "portable"),
    "best-build": (TODAY, "best"),
    "prefix": ({**TODAY, "llm.keep_prefix": True}, "portable"),
    "sequences": ({**TODAY, "llm.max_num_seqs": 4}, "portable"),
    "jump-forward": ({**TODAY, "llm.jump_forward": True}, "portable"),
    "draft": ({**TODAY, "llm.draft_tokens": 4}, "portable"),
    "all-but-draft": ({**ALL, "llm.draft_tokens": 0}, "best"),
    "all": (ALL, "best"),
}


def cpu_model() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def _inputs(args: argparse.Namespace):
    from hybridmem_local.eval.locomo import load_locomo

    dataset = load_locomo(args.locomo)
    sessions = [conversation.sessions[0] for conversation in dataset.conversations][: args.sessions]
    curated_turns = {turn.turn_id: session.session_id for session in sessions for turn in session.turns}
    covered_questions = [
        q
        for conversation in dataset.conversations
        for q in conversation.questions
        if q.evidence
        and all(turn_id in curated_turns for turn_id in q.evidence)
        and conversation.namespace in {s.namespace for s in sessions}
    ]
    conversation = next(c for c in dataset.conversations if c.sample_id == args.conversation)
    questions = [q.question for q in conversation.questions][: 2 * args.questions]
    return sessions, covered_questions, conversation, questions


def run_setting(name: str, args: argparse.Namespace, store: Path) -> dict:
    """One setting's work; runs in a child process."""
    from hybridmem_local.config import load_config
    from hybridmem_local.curation.curator import Curator
    from hybridmem_local.embedding import build_embedder
    from hybridmem_local.eval.metrics import evidence_recall
    from hybridmem_local.llm import build_llm
    from hybridmem_local.memory import HybridMemory
    from hybridmem_local.weights.offline import enforce_offline

    enforce_offline()
    levers, build = SETTINGS[name]
    if build == "portable":  # the user's LLAMA_CPP_LIB_PATH wins over the choice by CPU flags
        os.environ[LIB_PATH_ENV] = str(package_lib_dir())
    overrides = {"llm.n_threads": args.threads, **levers}
    config = load_config(None, overrides)
    sessions, covered_questions, conversation, questions = _inputs(args)
    load_average = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder, PeakRSS([os.getpid()]) as peak:
        db = Path(folder) / "store.db"
        shutil.copy(store, db)
        embedder = build_embedder(config.embedder)
        started = time.perf_counter()
        llm = build_llm(config.llm)  # no call cache: every reply is generated
        load_s = time.perf_counter() - started

        curator = Curator(llm, config.llm, config.curation, embed=embedder.embed)
        started = time.perf_counter()
        outcomes = curator.curate(sessions)
        curate_s = time.perf_counter() - started
        covered = {
            t for o in outcomes if o.result for m in [*o.result.episodes, *o.result.tuples] for t in m.source_turn_ids
        }
        recalls = [evidence_recall(covered, q.evidence) for q in covered_questions]

        memory = HybridMemory.open(db, config, embedder=embedder, llm=llm)
        single, batched = questions[: args.questions], questions[args.questions :]
        latencies = []
        started = time.perf_counter()
        single_answers = []
        for question in single:
            asked = time.perf_counter()
            single_answers.append(memory.answer(question, namespace=conversation.namespace).answer)
            latencies.append(time.perf_counter() - asked)
        single_s = time.perf_counter() - started
        started = time.perf_counter()
        batched_answers = [a.answer for a in memory.answer_many(batched, namespace=conversation.namespace)]
        batched_s = time.perf_counter() - started
        memory.close()
        stats = llm.decoder.stats
        kernels = llm.kernels
        llm.close()
    prompt_tokens = sum(o.usage.prompt_tokens for o in outcomes)
    return {
        "setting": name,
        "overrides": overrides,
        "kernels": f"{kernels.variant} ({kernels.reason})",
        "load_average_before": [round(x, 2) for x in load_average],
        "load_s": round(load_s, 1),
        "sessions": len(sessions),
        "curate_s": round(curate_s, 1),
        "sessions_per_min": round(len(sessions) / curate_s * 60, 2),
        "curation_prompt_tokens": prompt_tokens,
        "curation_completion_tokens": sum(o.usage.completion_tokens for o in outcomes),
        "evidence_questions": len(recalls),
        "evidence_recall": round(sum(bool(r) for r in recalls) / max(len(recalls), 1), 3),
        "answers_single": len(single),
        "single_answer_p50_s": round(statistics.median(latencies), 1),
        "answers_per_min_single": round(len(single) / single_s * 60, 2),
        "answers_per_min_batched": round(len(batched) / batched_s * 60, 2),
        "decoder": {
            "steps": stats.steps,
            "prompt_tokens_read": stats.prompt_tokens_read,
            "prompt_tokens_reused": stats.prompt_tokens_reused,
            "sampled_tokens": stats.sampled_tokens,
            "forced_tokens": stats.forced_tokens,
            "draft_tokens": stats.draft_tokens,
            "draft_accepted": stats.draft_accepted,
        },
        "peak_rss_gb": round(peak.peak / 1e9, 2),
        "memories": {
            o.session_id: o.result.model_dump(mode="json", exclude={"episodes": {"__all__": {"provenance"}}})
            if o.result
            else None
            for o in outcomes
        },
        "answers": single_answers + batched_answers,
    }


def _child(name: str, args: argparse.Namespace, store: Path, queue) -> None:
    queue.put(run_setting(name, args, store))


def _build_store(args: argparse.Namespace, folder: Path) -> Path:
    """The answers' store: conversation ``--conversation`` stored raw, with MiniLM indexes."""
    from hybridmem_local.config import load_config
    from hybridmem_local.memory import HybridMemory

    _, _, conversation, _ = _inputs(args)
    db = folder / "answers.db"
    with HybridMemory.open(db, load_config(None, {"curation.mode": "queue"})) as memory:
        memory.ingest(conversation.sessions)
        memory.search("warm-up", namespace=conversation.namespace)  # builds the indexes now
    return db


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ", ".join(SETTINGS))
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--sessions", type=int, default=3, help="first session of the first N conversations")
    parser.add_argument("--conversation", default="conv-26", help="the answers' conversation")
    parser.add_argument("--questions", type=int, default=4, help="questions answered one by one, and as many batched")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    report: dict = {"cpu": cpu_model(), "threads": args.threads, "rows": []}
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        store = _build_store(args, Path(folder))
        for name in args.settings.split(","):
            queue = context.Queue()
            child = context.Process(target=_child, args=(name, args, store, queue))
            child.start()
            row = queue.get()
            child.join()
            report["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("memories", "answers")}), flush=True)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=2) + "\n")

    rows = {row["setting"]: row for row in report["rows"]}
    base = rows.get("today")
    columns = ["sessions_per_min", "answers_per_min_single", "answers_per_min_batched", "single_answer_p50_s"]
    print(f"CPU: {report['cpu']}, {args.threads} threads")
    print("| setting | " + " | ".join(columns) + " | evidence recall | same memories / answers | peak RSS GB |")
    print("|" + "---|" * (len(columns) + 4))
    for name, row in rows.items():
        cells = []
        for column in columns:
            ratio = f" ({row[column] / base[column]:.2f}x)" if base and base[column] else ""
            cells.append(f"{row[column]}{ratio}")
        same = "-" if not base else "/".join("yes" if row[k] == base[k] else "no" for k in ("memories", "answers"))
        print(f"| {name} | " + " | ".join(cells) + f" | {row['evidence_recall']} | {same} | {row['peak_rss_gb']} |")


if __name__ == "__main__":
    main()
