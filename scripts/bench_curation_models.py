"""The embedded LLM tiers compared on curation: same sessions, same prompts, one model after another.

For each model (a name from hybridmem_local/weights/manifest.yaml, run by llama.cpp), in a fresh child process
so that its peak memory is its own: load it, curate the sessions with ``Curator.curate`` (no
call cache, MiniLM for provenance alignment), and report

- load time, curation wall time and sessions per minute;
- prompt and completion tokens per session;
- the share of windows whose first reply was schema-valid (before any split-in-half retry),
  and of replies kept by salvage (cut off or stopped looping, complete memories kept);
- the share of sessions that yield no tuple, and episodes / tuples stored per session (after
  the checks curation applies: content, loops, schema-name echoes);
- peak RSS of the child, and the model file's size on disk.

The sessions are the first ``--per-conversation`` sessions of each of the 8 LoCoMo dev
conversations (and, with ``--demo``, the three bundled demo sessions first).

    .venv/bin/python scripts/bench_curation_models.py --out runs/bench_curation_models.json
    .venv/bin/python scripts/bench_curation_models.py --models qwen2.5-coder-0.5b-instruct \
        --set curation.turns_per_episode=4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

# scripts/ is not a package: the imports below (noqa: E402) need its path entry first.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vllm_curation import DEFAULT_LOCOMO, PeakRSS  # noqa: E402  (scripts/ is not a package)

MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"]


def _sessions(locomo: Path, per_conversation: int, demo: bool):
    from hybridmem_local.cli.main import DEMO_SESSIONS
    from hybridmem_local.eval.locomo import load_locomo
    from hybridmem_local.files.session_files import read_sessions_jsonl

    sessions = read_sessions_jsonl(DEMO_SESSIONS, "demo") if demo else []
    if per_conversation:
        for conversation in load_locomo(locomo).conversations:
            sessions.extend(conversation.sessions[:per_conversation])
    return sessions


def run_one(model: str, args: argparse.Namespace, overrides: dict) -> dict:
    """Curate the sessions with one model; runs in a child process."""
    import os

    from hybridmem_local.config import load_config
    from hybridmem_local.curation.curator import Curator
    from hybridmem_local.embedding import build_embedder
    from hybridmem_local.llm import build_llm
    from hybridmem_local.weights.offline import enforce_offline
    from hybridmem_local.weights.resolve import resolve_model

    enforce_offline()
    config = load_config(None, {"llm.model": model, "llm.n_threads": args.threads, **overrides})
    sessions = _sessions(args.locomo, args.per_conversation, args.demo)
    with PeakRSS([os.getpid()]) as peak:
        embedder = build_embedder(config.embedder)
        started = time.perf_counter()
        llm = build_llm(config.llm)
        load_s = time.perf_counter() - started
        curator = Curator(llm, config.llm, config.curation, embed=embedder.embed)
        started = time.perf_counter()
        outcomes = []
        for session in sessions:  # one by one: llama.cpp is sequential anyway; progress shows
            [outcome] = curator.curate([session])
            outcomes.append(outcome)
            print(
                f"  {model} {session.session_id}: {outcome.result and len(outcome.result.episodes)} episodes, "
                f"{outcome.result and len(outcome.result.tuples)} tuples, {outcome.usage.completion_tokens} "
                f"completion tokens{'; ' + outcome.error[:120] if outcome.error else ''}",
                flush=True,
            )
        curate_s = time.perf_counter() - started
    windows = sum(o.windows for o in outcomes)
    results = [o.result for o in outcomes]
    n = len(sessions)
    return {
        "model": model,
        "file_mb": round(resolve_model(model).path.stat().st_size / 1e6, 1),
        "sessions": n,
        "turns": sum(len(s.turns) for s in sessions),
        "load_s": round(load_s, 1),
        "curate_s": round(curate_s, 1),
        "sessions_per_min": round(n / curate_s * 60, 2),
        "prompt_tokens_per_session": round(sum(o.usage.prompt_tokens for o in outcomes) / n),
        "completion_tokens_per_session": round(sum(o.usage.completion_tokens for o in outcomes) / n),
        "windows": windows,
        "valid_first_try": round(1 - sum(o.windows_failed_first for o in outcomes) / windows, 3),
        "salvaged": sum(o.windows_salvaged for o in outcomes),
        "curated_share": round(sum(o.ok for o in outcomes) / n, 3),
        "zero_tuple_share": round(sum(not r or not r.tuples for r in results) / n, 3),
        "episodes_per_session": round(sum(len(r.episodes) for r in results if r) / n, 2),
        "tuples_per_session": round(sum(len(r.tuples) for r in results if r) / n, 2),
        "left_out_per_session": round(sum(len(o.dropped_memories) for o in outcomes) / n, 2),
        "peak_rss_gb": round(peak.peak / 1e9, 2),
        "errors": [o.error for o in outcomes if o.error],
        "memories": {
            o.session_id: o.result.model_dump(mode="json", exclude={"episodes": {"__all__": {"provenance"}}})
            if o.result
            else None
            for o in outcomes
        },
    }


def _child(model: str, args: argparse.Namespace, overrides: dict, queue) -> None:
    queue.put(run_one(model, args, overrides))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated manifest names")
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--per-conversation", type=int, default=1, help="first N sessions of each dev conversation")
    parser.add_argument("--demo", action="store_true", help="the three demo sessions too")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="KEY=VALUE config override")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from hybridmem_local.cli.common import parse_overrides

    overrides = parse_overrides(args.overrides)
    rows = []
    context = multiprocessing.get_context("spawn")
    for model in args.models.split(","):
        queue = context.Queue()
        child = context.Process(target=_child, args=(model, args, overrides, queue))
        child.start()
        row = queue.get()
        child.join()
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "memories"}), flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"overrides": overrides, "rows": rows}, indent=2) + "\n")

    columns = [
        "model",
        "file_mb",
        "load_s",
        "sessions_per_min",
        "completion_tokens_per_session",
        "valid_first_try",
        "salvaged",
        "zero_tuple_share",
        "episodes_per_session",
        "tuples_per_session",
        "peak_rss_gb",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
