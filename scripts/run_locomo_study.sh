#!/usr/bin/env bash
# The paper's method measured at a size that decides (issue #32 item 6), one shard at a time:
# a shard is one LoCoMo conversation done start to end (curate every session, consolidate at
# mcs 5 and 10, answer with every system, judge against LoCoMo's gold and the audited gold, grade
# the judge's planted and reworded answers; the strict judge prompt, whose error rates
# scripts/measure_judge.py measured against mem0's). Its records land in docs/results/locomo-study/shards/<id>/
# (commit them); its store and LLM cache stay under runs/ (not records). Any machine can take the
# next shard; `hybridmem eval report docs/results/locomo-study` rebuilds the tables from all of them.
# A shard outlasts its machine: its folder keeps the memories curated and consolidated so far
# (memories/, no turns) and every answered question, so committing an unfinished shard's folder
# lets the next machine resume it without the stores or the LLM cache (the report leaves it out
# until it writes its summary.json).
#
#   scripts/run_locomo_study.sh conv-30                # one shard
#   scripts/run_locomo_study.sh conv-30 conv-26 ...    # several, one after the other
#
# The sample: 300 questions of categories 1-4 stratified by conversation and category, seed 0,
# drawn over the whole file, so a shard answers the same questions wherever it runs.
# Settings (environment variables, defaults in brackets):
#   HYBRIDMEM_LOCOMO_DATA   LoCoMo dev file        [../shared/data/locomo/locomo_dev8.json]
#   HYBRIDMEM_LOCOMO_AUDIT  audited gold answers   [the locomo_audit_errors_dev8.json beside it]
#   HYBRIDMEM_STUDY_THREADS llama.cpp threads      [1: leaves the other core to everything else]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

data=${HYBRIDMEM_LOCOMO_DATA:-../shared/data/locomo/locomo_dev8.json}
audit=${HYBRIDMEM_LOCOMO_AUDIT:-$(dirname "$data")/locomo_audit_errors_dev8.json}
study=docs/results/locomo-study
for conversation in "$@"; do
  started=$(date +%s)
  .venv/bin/hybridmem eval locomo --data "$data" --config configs/paper.yaml \
    --set "llm.n_threads=${HYBRIDMEM_STUDY_THREADS:-1}" --set answering.evidence_turns=false \
    --conversations "$conversation" --sample 300 --sample-seed 0 --audited-gold "$audit" \
    --systems episodic-only,relational-only,hybrid,hybrid+consolidation,rag,fused --mcs 5,10 \
    --context-budget 2048 --judge-prompt strict --judge-audit 1000 --judge-rewordings 1000 --checkpoints \
    --stores runs/locomo-study/stores --llm-cache runs/locomo-study/llm_cache.sqlite \
    --out "$study/shards/$conversation" > /dev/null
  echo "$conversation: shard done in $(( ($(date +%s) - started) / 60 )) min"
done
.venv/bin/hybridmem eval report "$study"
