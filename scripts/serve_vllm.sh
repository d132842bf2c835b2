#!/usr/bin/env bash
# Serve a local model with vLLM's OpenAI-compatible server, for the `openai-server` LLM backend.
# Offline: no hub access, no usage stats; listens on 127.0.0.1 unless told otherwise.
#
#   scripts/serve_vllm.sh [run] [--config FILE] [EXTRA...]   # foreground (exec vllm serve)
#   scripts/serve_vllm.sh start [--config FILE] [EXTRA...]   # background: waits for /health, writes a PID file
#   scripts/serve_vllm.sh stop  [--config FILE]              # SIGTERM (then SIGKILL after 30 s), removes the PID file
#   scripts/serve_vllm.sh status [--config FILE]             # exit 0 when the PID is alive and /health answers
#
# With --config, the flags come from the file's `llm` section, as the in-process backend would
# build the engine (hybridmem_local/llm/serve_args.py): the model resolved by name through the
# manifest (e.g. smollm2-135m-instruct-hf), host/port from llm.base_url, dtype, enforce_eager,
# max_num_seqs, max_model_len, seed; on vLLM's CPU build VLLM_CPU_KVCACHE_SPACE from
# llm.cpu_kvcache_space_gib and no GPU-only flags; on a GPU tensor/pipeline parallel sizes,
# gpu_memory_utilization and the executor backend. E.g. on this project's CPU machines:
#   scripts/serve_vllm.sh start --config configs/vllm-cpu.yaml   # SmolLM2 on http://127.0.0.1:8011/v1
# Without --config, the Qwen3-8B GPU defaults below (environment variables, defaults in brackets):
#   scripts/serve_vllm.sh                       # 1 GPU, qwen3-8b, http://127.0.0.1:8000/v1
#   HYBRIDMEM_TP=2 scripts/serve_vllm.sh        # tensor parallel over 2 GPUs
#   HYBRIDMEM_PP=2 HYBRIDMEM_EXECUTOR=ray scripts/serve_vllm.sh   # pipeline parallel across Ray nodes
#   scripts/serve_vllm.sh --enforce-eager       # extra arguments go to `vllm serve` unchanged
#   HYBRIDMEM_MODEL_PATH        model folder            [qwen3-8b where `hybridmem models download` put
#                               it: $HYBRIDMEM_MODELS_DIR, else the repo's models/, else ~/.local/share/hybridmem/models]
#   HYBRIDMEM_SERVED_NAME       name clients ask for    [qwen3-8b]  (= llm.model in the config)
#   HYBRIDMEM_HOST / _PORT      listen address          [127.0.0.1 / 8000]
#   HYBRIDMEM_TP / HYBRIDMEM_PP tensor / pipeline parallel sizes  [1 / 1]
#   HYBRIDMEM_MAX_MODEL_LEN     context window          [32768, Qwen3-8B's native length]
#   HYBRIDMEM_GPU_MEMORY_UTILIZATION                    [0.90]
#   HYBRIDMEM_EXECUTOR          mp | ray | (empty: vLLM decides)   []
#   HYBRIDMEM_REASONING_PARSER  splits <think> from the answer     [qwen3]
#   HYBRIDMEM_SEED              [0]
# Either way:
#   HYBRIDMEM_API_KEY           when set, the server requires it (the client reads the same variable)
#   HYBRIDMEM_VLLM              the vllm executable     [.venv-vllm/bin/vllm if present, else vllm]
#   HYBRIDMEM_PYTHON            python that reads --config [.venv-vllm/bin/python if present, else python3]
#   HYBRIDMEM_VLLM_DEVICE       cpu | cuda: the build --config plans for [the installed vLLM's]
#   HYBRIDMEM_SERVE_WAIT        seconds `start` waits for /health [600]
#   HYBRIDMEM_VLLM_STATE        PID and log files       [.vllm/ in the repo]
# vLLM's caches, compile caches and ZMQ sockets go under .vllm/ too (VLLM_CACHE_ROOT,
# VLLM_RPC_BASE_PATH, TORCHINDUCTOR_CACHE_DIR) unless already set.
# Variables are prefixed HYBRIDMEM_ because vLLM itself reads VLLM_* (e.g. VLLM_PORT).
# The GPU path is written against vLLM's documented flags and NOT exercised by this project (no GPU).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

command=run
case "${1:-}" in
    run|start|stop|status) command=$1; shift ;;
esac
config=""
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --config) config=$2; shift 2 ;;
        --config=*) config=${1#--config=}; shift ;;
        *) extra+=("$1"); shift ;;
    esac
done

default_tool() {  # $1: program in .venv-vllm/bin, $2: fallback
    if [[ -x "$repo_root/.venv-vllm/bin/$1" ]]; then echo "$repo_root/.venv-vllm/bin/$1"; else echo "$2"; fi
}
default_model_path() {  # $1: model name; where `hybridmem models download` puts it (hybridmem_local/weights/folders.py)
    local data_home="$HOME/.local/share"
    [[ "${XDG_DATA_HOME:-}" == /* ]] && data_home=$XDG_DATA_HOME  # a relative value is ignored (XDG)
    if [[ -n "${HYBRIDMEM_MODELS_DIR:-}" ]]; then echo "$HYBRIDMEM_MODELS_DIR/$1"
    elif [[ -d "$repo_root/models/$1" ]]; then echo "$repo_root/models/$1"
    else echo "$data_home/hybridmem/models/$1"; fi
}
vllm_bin="${HYBRIDMEM_VLLM:-$(default_tool vllm vllm)}"
python_bin="${HYBRIDMEM_PYTHON:-$(default_tool python python3)}"
state_dir="${HYBRIDMEM_VLLM_STATE:-$repo_root/.vllm}"

serve_env=()
if [[ -n "$config" ]]; then
    if ! settings=$(cd "$repo_root" && "$python_bin" -m hybridmem_local.llm.serve_args "$config" \
                        ${HYBRIDMEM_VLLM_DEVICE:+--device "$HYBRIDMEM_VLLM_DEVICE"}); then
        echo "serve_vllm.sh: cannot build the vllm serve command from $config (see above)" >&2
        exit 2
    fi
    eval "$settings"
    args=("${serve_args[@]}")
    host=$serve_host port=$serve_port
else
    model_path="${HYBRIDMEM_MODEL_PATH:-$(default_model_path qwen3-8b)}"
    host="${HYBRIDMEM_HOST:-127.0.0.1}" port="${HYBRIDMEM_PORT:-8000}"
    if [[ "$command" == run || "$command" == start ]] && [[ ! -f "$model_path/config.json" ]]; then
        echo "serve_vllm.sh: no model at $model_path (config.json missing);" \
             "download it with 'hybridmem models download qwen3-8b' or set HYBRIDMEM_MODEL_PATH" >&2
        exit 2
    fi
    args=(
        serve "$model_path"
        --served-model-name "${HYBRIDMEM_SERVED_NAME:-qwen3-8b}"
        --host "$host"
        --port "$port"
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
fi
if [[ -n "${HYBRIDMEM_API_KEY:-}" ]]; then
    args+=(--api-key "$HYBRIDMEM_API_KEY")
fi
args+=(${extra[@]+"${extra[@]}"})

pid_file="$state_dir/serve-$port.pid"
log_file="$state_dir/serve-$port.log"
health_url="http://$host:$port/health"

healthy() {
    "$python_bin" - "$health_url" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

running_pid() {  # prints the PID when the PID file names a live process
    [[ -f "$pid_file" ]] || return 1
    local pid
    pid=$(cat "$pid_file")
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

stop_server() {
    local pid
    if ! pid=$(running_pid); then
        rm -f "$pid_file"
        echo "serve_vllm.sh: no server running for port $port"
        return 0
    fi
    # The server runs in its own process group (setsid): signal the group, API server and engine alike.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "serve_vllm.sh: server $pid ignored SIGTERM for 30 s; killing it" >&2
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
    echo "serve_vllm.sh: stopped server $pid (port $port)"
}

case "$command" in
    stop) stop_server; exit 0 ;;
    status)
        if pid=$(running_pid) && healthy; then echo "serve_vllm.sh: server $pid healthy at $health_url"; exit 0; fi
        echo "serve_vllm.sh: no healthy server at $health_url"; exit 1 ;;
esac

# Offline and private: never reach the hub, never send usage statistics. vLLM's files stay in the repo.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$state_dir/cache}"
export VLLM_RPC_BASE_PATH="${VLLM_RPC_BASE_PATH:-$state_dir/rpc}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$state_dir/inductor}"
for assignment in ${serve_env[@]+"${serve_env[@]}"}; do
    export "$assignment"
done

if [[ "$command" == run ]]; then
    mkdir -p "$VLLM_RPC_BASE_PATH" 2>/dev/null || true
    exec "$vllm_bin" "${args[@]}"
fi

# start
mkdir -p "$state_dir" "$VLLM_RPC_BASE_PATH"
if pid=$(running_pid); then
    echo "serve_vllm.sh: a server is already running for port $port (PID $pid); stop it first" >&2
    exit 1
fi
started=$(date +%s)
setsid "$vllm_bin" "${args[@]}" >"$log_file" 2>&1 < /dev/null &
pid=$!
echo "$pid" > "$pid_file"
deadline=$(( started + ${HYBRIDMEM_SERVE_WAIT:-600} ))
until healthy; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "serve_vllm.sh: the server exited before answering $health_url; last lines of $log_file:" >&2
        tail -n 30 "$log_file" >&2
        rm -f "$pid_file"
        exit 1
    fi
    if (( $(date +%s) > deadline )); then
        echo "serve_vllm.sh: no answer from $health_url after ${HYBRIDMEM_SERVE_WAIT:-600}s; stopping it" >&2
        stop_server >&2
        exit 1
    fi
    sleep 1
done
echo "serve_vllm.sh: server $pid healthy at $health_url after $(( $(date +%s) - started ))s (log $log_file, stop: $0 stop${config:+ --config $config})"
