"""The judge's two error rates on the study's sample, for each LoCoMo judge prompt (issue #32 item 6).

    PYTHONPATH=$PWD python scripts/measure_judge.py --set llm.n_threads=1
    PYTHONPATH=$PWD python scripts/measure_judge.py --prompts strict --planted 300 --reworded 150

For the stratified sample of the study (300 questions of categories 1-4 over the 8 LoCoMo dev
conversations, seed 0; ``eval/sampling.py``) the judge grades, with each prompt:

* ``--planted`` wrong answers: another question's gold answer about the same conversation and
  people, sharing no stemmed token with the real gold (``judge_audit.plant_answers``): every
  CORRECT is a false accept;
* ``--reworded`` gold answers said another way without changing what they say (a date written
  another way, a list reordered, the answer put in a sentence; ``judge_audit.reword_answers``):
  every WRONG is a false reject.

No curation and no answers are needed, so this runs before any shard and decides which prompt
scores the study. Rows go to ``--out`` (JSONL, one per graded answer, with its prompt); a rerun
grades only what is missing, and the LLM cache makes it free. ``hybridmem eval report`` shows the
rates beside the shards' figures.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from hybridmem_local.config import load_config
from hybridmem_local.eval.benchmarks import load_benchmark
from hybridmem_local.eval.judge import LOCOMO_JUDGE_PROMPTS, build_judge_request, verdict_of
from hybridmem_local.eval.judge_audit import PLANTED, REWORDED, plant_answers, reword_answers, summarise_audit
from hybridmem_local.eval.options import RunOptions
from hybridmem_local.eval.records import append_jsonl, read_records
from hybridmem_local.llm import build_llm

REPO = Path(__file__).resolve().parents[1]
#: Answers graded per batched call, each chunk saved before the next.
CHUNK = 16


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared/data/locomo/locomo_dev8.json")
    parser.add_argument("--config", type=Path, default=REPO / "configs/paper.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--planted", type=int, default=200)
    parser.add_argument("--reworded", type=int, default=100)
    parser.add_argument("--prompts", default=",".join(LOCOMO_JUDGE_PROMPTS))
    parser.add_argument("--out", type=Path, default=REPO / "docs/results/locomo-study/judge_audit.jsonl")
    parser.add_argument("--llm-cache", type=Path, default=REPO / "runs/locomo-study/judge_cache.sqlite")
    args = parser.parse_args(argv)

    overrides = dict(item.split("=", 1) for item in args.overrides)
    config = load_config(args.config, overrides)
    options = RunOptions(benchmark="locomo", data=args.data, out=args.out.parent, sample=args.sample)
    conversations = load_benchmark(options).conversations
    seed = config.llm.seed
    planted = plant_answers(conversations, len(conversations) * 1000, seed=seed)
    planted = random.Random(seed).sample(planted, min(args.planted, len(planted)))
    reworded = reword_answers(conversations, args.reworded, seed=seed)
    graded = [(PLANTED, p.model_dump(), p.planted) for p in planted] + [
        (REWORDED, r.model_dump(), r.reworded) for r in reworded
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.llm_cache.parent.mkdir(parents=True, exist_ok=True)
    judge_model = f"{config.llm.backend}:{config.llm.model}"
    llm = build_llm(config.judge or config.llm, cache_path=args.llm_cache)
    prompts = args.prompts.split(",")
    # Planted and reworded answers in a seeded random order, each chunk graded by every prompt in
    # turn, so a run stopped early still compares the prompts on the same answers.
    random.Random(seed).shuffle(graded)
    try:
        for start in range(0, len(graded), CHUNK):  # saved as it goes: a killed run keeps what it graded
            for prompt in prompts:
                done = {
                    (r["kind"], r["question_id"], r["answer"])
                    for r in read_records(args.out)
                    if r["judge_prompt"] == prompt and r["judge_model"] == judge_model
                }
                chunk = [g for g in graded[start : start + CHUNK] if (g[0], g[1]["question_id"], g[2]) not in done]
                if not chunk:
                    continue
                requests = [
                    build_judge_request(
                        fields["question"], fields["gold"], answer, "locomo", fields["category"], locomo_judge=prompt
                    ).model_copy(update={"tag": "judge-audit"})
                    for _, fields, answer in chunk
                ]
                rows = []
                for (kind, fields, answer), result in zip(chunk, llm.generate(requests), strict=True):
                    verdict = verdict_of(result)
                    rows.append(
                        {
                            "judge_prompt": prompt,
                            "judge_model": judge_model,
                            "kind": kind,
                            **fields,
                            "answer": answer,
                            "label": None if verdict is None else verdict.label,
                            "reasoning": None if verdict is None else verdict.reasoning,
                        }
                    )
                append_jsonl(args.out, rows)
            print(f"{min(start + CHUNK, len(graded))} of {len(graded)} answers graded by each prompt", flush=True)
        for prompt in prompts:
            mine = [
                r for r in read_records(args.out) if r["judge_prompt"] == prompt and r["judge_model"] == judge_model
            ]
            audit = summarise_audit(mine, judge_model)
            print(
                f"{prompt}: false accepts {audit['accepted']}/{audit['judged']} "
                f"({100 * (audit['false_accept_rate'] or 0):.1f}%), false rejects "
                f"{audit[REWORDED]['rejected']}/{audit[REWORDED]['judged']} "
                f"({100 * (audit[REWORDED]['false_reject_rate'] or 0):.1f}%)"
            )
    finally:
        llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
