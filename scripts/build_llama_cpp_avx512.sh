#!/usr/bin/env bash
# Builds llama.cpp's shared libraries a second time, for AVX-512 CPUs, into the venv beside the
# portable AVX2 build that llama-cpp-python installed; hybridmem_local/llm/cpu_kernels.py loads
# them (through LLAMA_CPP_LIB_PATH) on a CPU whose /proc/cpuinfo lists every flag build.json names.
#   bash scripts/build_llama_cpp_avx512.sh     # scripts/install.sh runs it; VENV=path picks the venv
# Compiling needs no AVX-512 CPU, so every install builds both. Skipped (in a second) when the
# folder holds a build for the installed llama-cpp-python version. AMX stays off: its tiles need
# a per-thread permission from the kernel, and a VM may advertise AMX it does not enable.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${VENV:-.venv}/bin/python
version=$("$python" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')
# under the venv's prefix, where cpu_kernels.py looks (sys.prefix/share/hybridmem/llama-cpp)
dest=$("$python" -c 'import sys; print(sys.prefix)')/share/hybridmem/llama-cpp/avx512

if "$python" - "$dest/build.json" "$version" <<'EOF'; then
import json, sys
try:
    built = json.load(open(sys.argv[1], encoding="utf-8"))["llama_cpp_python"]
except (OSError, ValueError, KeyError):
    sys.exit(1)
sys.exit(0 if built == sys.argv[2] else 1)
EOF
  echo "llama.cpp AVX-512 build: present for llama-cpp-python $version in $dest"
  exit 0
fi

# The flags each compiler switch below allows, as /proc/cpuinfo names them (GGML_AVX512 is
# -mavx512f/cd/vl/dq/bw; GGML_NATIVE=OFF also turns SSE4.2 and BMI2 on).
requires="sse4_2 avx avx2 fma f16c bmi2 avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni avx512_bf16"
cmake_args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$SECONDS
# --no-cache-dir: otherwise pip reuses the AVX2 wheel it cached when installing the package.
if ! CMAKE_ARGS=$cmake_args CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$python" -m pip install --quiet --no-cache-dir --no-binary llama-cpp-python --no-deps \
  --target "$work/target" "llama-cpp-python==$version" >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log" >&2
  echo "llama.cpp AVX-512 build failed (the last lines of its log are above)" >&2
  exit 1
fi

# Only the shared libraries: the Python bindings are the installed package's own.
rm -rf "$dest.partial"
mkdir -p "$dest.partial"
cp -a "$work/target/llama_cpp/lib/." "$dest.partial/"
"$python" - "$dest.partial/build.json" "$version" "$requires" "$cmake_args" <<'EOF'
import json, sys
path, version, requires, cmake_args = sys.argv[1:]
build = {"name": "avx512", "llama_cpp_python": version, "requires": requires.split(), "cmake_args": cmake_args}
with open(path, "w", encoding="utf-8") as out:
    json.dump(build, out, indent=2)
EOF
rm -rf "$dest"
mv "$dest.partial" "$dest"
elapsed=$((SECONDS - started))
echo "llama.cpp AVX-512 build: built in $((elapsed / 60)) min $((elapsed % 60)) s into $dest"
