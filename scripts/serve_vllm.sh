#!/usr/bin/env bash
# Serve Qwen3-8B from a local folder with vLLM's OpenAI-compatible server, for the
# `openai-server` LLM backend (configs/vllm-server.yaml). Offline: no hub access, no usage stats.
#
#   scripts/serve_vllm.sh                       # 1 GPU, models/qwen3-8b, http://127.0.0.1:8000/v1
#   HYBRIDMEM_TP=2 scripts/serve_vllm.sh        # tensor parallel over 2 GPUs
#   HYBRIDMEM_PP=2 HYBRIDMEM_EXECUTOR=ray scripts/serve_vllm.sh   # pipeline parallel across Ray nodes
#   scripts/serve_vllm.sh --enforce-eager       # extra arguments go to `vllm serve` unchanged
#
# Settings (environment variables, defaults in brackets):
#   HYBRIDMEM_MODEL_PATH        model folder            [models/qwen3-8b, from the repo root]
#   HYBRIDMEM_SERVED_NAME       name clients ask for    [qwen3-8b]  (= llm.model in the config)
#   HYBRIDMEM_HOST / _PORT      listen address          [127.0.0.1 / 8000]
#   HYBRIDMEM_TP / HYBRIDMEM_PP tensor / pipeline parallel sizes  [1 / 1]
#   HYBRIDMEM_MAX_MODEL_LEN     context window          [32768, Qwen3-8B's native length]
#   HYBRIDMEM_GPU_MEMORY_UTILIZATION                    [0.90]
#   HYBRIDMEM_EXECUTOR          mp | ray | (empty: vLLM decides)   []
#   HYBRIDMEM_REASONING_PARSER  splits <think> from the answer     [qwen3]
#   HYBRIDMEM_SEED              [0]
#   HYBRIDMEM_API_KEY           when set, the server requires it (the client reads the same variable)
#   HYBRIDMEM_VLLM              the vllm executable     [vllm]
# Variables are prefixed HYBRIDMEM_ because vLLM itself reads VLLM_* (e.g. VLLM_PORT).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model_path="${HYBRIDMEM_MODEL_PATH:-$repo_root/models/qwen3-8b}"

if [[ ! -f "$model_path/config.json" ]]; then
    echo "serve_vllm.sh: no model at $model_path (config.json missing);" \
         "download it with 'hybridmem models download qwen3-8b' or set HYBRIDMEM_MODEL_PATH" >&2
    exit 2
fi

args=(
    serve "$model_path"
    --served-model-name "${HYBRIDMEM_SERVED_NAME:-qwen3-8b}"
    --host "${HYBRIDMEM_HOST:-127.0.0.1}"
    --port "${HYBRIDMEM_PORT:-8000}"
    --tensor-parallel-size "${HYBRIDMEM_TP:-1}"
    --pipeline-parallel-size "${HYBRIDMEM_PP:-1}"
    --max-model-len "${HYBRIDMEM_MAX_MODEL_LEN:-32768}"
    --gpu-memory-utilization "${HYBRIDMEM_GPU_MEMORY_UTILIZATION:-0.90}"
    --reasoning-parser "${HYBRIDMEM_REASONING_PARSER:-qwen3}"
    --seed "${HYBRIDMEM_SEED:-0}"
)
if [[ -n "${HYBRIDMEM_EXECUTOR:-}" ]]; then
    args+=(--distributed-executor-backend "$HYBRIDMEM_EXECUTOR")
fi
if [[ -n "${HYBRIDMEM_API_KEY:-}" ]]; then
    args+=(--api-key "$HYBRIDMEM_API_KEY")
fi

# Offline and private: never reach the hub, never send usage statistics.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

exec "${HYBRIDMEM_VLLM:-vllm}" "${args[@]}" "$@"
