#!/usr/bin/env bash
# The paper's LoCoMo protocol with Qwen3-8B on vLLM, in one command (paper: LLM judge 76.2% with
# Qwen3-8B, §5.1 / Table 4). NOT RUN HERE: it was written and checked on a CPU-only machine
# (the same harness runs there with SmolLM2); the numbers it prints are the first real ones.
#
#   scripts/run_locomo_gpu.sh                                   # in-process vLLM, judge = Qwen3-8B
#   HYBRIDMEM_EVAL_CONFIG=configs/vllm-server.yaml scripts/run_locomo_gpu.sh   # against scripts/serve_vllm.sh
#   HYBRIDMEM_JUDGE_BASE_URL=http://judge:8000/v1 HYBRIDMEM_JUDGE_MODEL=gpt-4o-mini scripts/run_locomo_gpu.sh
#
# Three runs share one set of curated stores and one LLM call cache, so curation happens once
# and any step can be re-run (or resumed after a crash) for free:
#   1. main      all systems (Table 1 + appendix D): hybrid, hybrid+consolidation, episodic-only,
#                relational-only, full-context, rag (RAG-4096), adversarial questions excluded
#   2. k-sweep   hybrid at k = 2, 5, 10, 20 (§5.2)
#   3. mcs-sweep hybrid+consolidation at min_cluster_size 2, 5, 10, 20 (§5.3, Table 5)
# Each writes predictions.jsonl, summary.{json,md,csv}, plots and manifest.json to its folder.
#
# Settings (environment variables, defaults in brackets):
#   HYBRIDMEM_LOCOMO_DATA     the official locomo10.json          [data/locomo/locomo10.json]
#   HYBRIDMEM_EVAL_OUT        results root                        [runs/locomo-qwen3-8b]
#   HYBRIDMEM_EVAL_CONFIG     LLM config                          [configs/vllm-offline.yaml]
#   HYBRIDMEM_EVAL_STEPS      which runs, space-separated         [main k-sweep mcs-sweep]
#   HYBRIDMEM_EVAL_BATCH      questions per batched call          [256]
#   HYBRIDMEM_JUDGE_BASE_URL / HYBRIDMEM_JUDGE_MODEL   an OpenAI-compatible judge server and model;
#                             unset: Qwen3-8B judges its own answers (say so when quoting numbers)
#   HYBRIDMEM_JUDGE_API_KEY_ENV   variable holding the judge's API key   [HYBRIDMEM_JUDGE_API_KEY]
#   HYBRIDMEM_EVAL_SET        config overrides, space-separated KEY=VALUE, e.g. "retrieval.mode=dense"
#                             (the paper searched densely; the project default fuses dense and BM25)
#   HYBRIDMEM_EVAL_EXTRA      extra arguments for every run, e.g. "--limit 20 --conversations conv-26"
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

data="${HYBRIDMEM_LOCOMO_DATA:-data/locomo/locomo10.json}"
out="${HYBRIDMEM_EVAL_OUT:-runs/locomo-qwen3-8b}"
config="${HYBRIDMEM_EVAL_CONFIG:-configs/vllm-offline.yaml}"
steps="${HYBRIDMEM_EVAL_STEPS:-main k-sweep mcs-sweep}"
batch="${HYBRIDMEM_EVAL_BATCH:-256}"

if [[ ! -f "$data" ]]; then
    echo "run_locomo_gpu.sh: no LoCoMo file at $data; set HYBRIDMEM_LOCOMO_DATA to your copy of locomo10.json" >&2
    exit 2
fi
if [[ ! -f "$config" ]]; then
    echo "run_locomo_gpu.sh: no config at $config; set HYBRIDMEM_EVAL_CONFIG" >&2
    exit 2
fi

# All sessions of a conversation curated in one batched vLLM call.
common=(--data "$data" --config "$config" --stores "$out/stores" --llm-cache "$out/llm_cache.sqlite"
        --batch-size "$batch" --set "curation.batch_sessions=64")
for pair in ${HYBRIDMEM_EVAL_SET:-}; do
    common+=(--set "$pair")
done
if [[ -n "${HYBRIDMEM_JUDGE_BASE_URL:-}" ]]; then
    common+=(
        --set "judge.backend=openai-server"
        --set "judge.model=${HYBRIDMEM_JUDGE_MODEL:?set HYBRIDMEM_JUDGE_MODEL with HYBRIDMEM_JUDGE_BASE_URL}"
        --set "judge.base_url=$HYBRIDMEM_JUDGE_BASE_URL"
        --set "judge.api_key_env=${HYBRIDMEM_JUDGE_API_KEY_ENV:-HYBRIDMEM_JUDGE_API_KEY}"
        --set "judge.temperature=0.0"
    )
fi
# shellcheck disable=SC2206  # word splitting of the extra arguments is intended
extra=(${HYBRIDMEM_EVAL_EXTRA:-})

# Offline and private: never reach the hub, never send usage statistics.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

for step in $steps; do
    case "$step" in
        main)
            hybridmem eval locomo "${common[@]}" "${extra[@]}" --out "$out/main" \
                --systems hybrid,hybrid+consolidation,episodic-only,relational-only,full-context,rag
            ;;
        k-sweep)
            hybridmem eval locomo "${common[@]}" "${extra[@]}" --out "$out/k-sweep" --systems hybrid --k 2,5,10,20
            ;;
        mcs-sweep)
            hybridmem eval locomo "${common[@]}" "${extra[@]}" --out "$out/mcs-sweep" \
                --systems hybrid,hybrid+consolidation --mcs 2,5,10,20
            ;;
        *)
            echo "run_locomo_gpu.sh: unknown step '$step' (main, k-sweep, mcs-sweep)" >&2
            exit 2
            ;;
    esac
done
echo "results: $out/{main,k-sweep,mcs-sweep}/summary.md"
