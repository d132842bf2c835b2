"""Which llama.cpp build loads: the choice from cpuinfo text and build folders (fast), and the
AVX-512 build scripts/install.sh makes, loaded for real in a child process (slow)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hybridmem_local.llm import cpu_kernels
from hybridmem_local.llm.cpu_kernels import (
    BUILDS_ENV,
    CHOSEN_ENV,
    LIB_PATH_ENV,
    PORTABLE,
    CpuInfo,
    choose_llama_cpp_build,
    read_cpu,
    simd_features,
)

REPO = Path(__file__).resolve().parents[2]

#: The flags of the AMD EPYC these tests were written on (AVX-512 with VNNI/BF16/VBMI, no AMX).
EPYC_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
    "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid "
    "extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt "
    "tsc_deadline_timer aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a "
    "misalignsse 3dnowprefetch osvw topoext cpuid_fault vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms "
    "invpcid avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl "
    "xsaveopt xsavec xgetbv1 xsaves avx512_bf16 clzero xsaveerptr arat avx512vbmi umip avx512_vbmi2 gfni vaes "
    "vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq rdpid fsrm"
)
#: What scripts/build_llama_cpp_avx512.sh writes into build.json.
AVX512_REQUIRES = [
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx512f",
    "avx512cd",
    "avx512vl",
    "avx512dq",
    "avx512bw",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
]


def cpuinfo_text(flags: str, model: str = "AMD EPYC") -> str:
    processor = f"processor\t: {{n}}\nvendor_id\t: AuthenticAMD\nmodel name\t: {model}\nflags\t\t: {flags}\n"
    return "\n".join(processor.format(n=n) for n in range(2))


@pytest.fixture
def installed_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llama-cpp-python is not installed (the cpu-llm extra)")


@pytest.fixture
def builds(tmp_path, monkeypatch) -> Path:
    """An empty folder of builds in place of the venv's, with llama_cpp not yet imported and
    no library folder chosen (restored after the test, whatever the choice set meanwhile)."""
    for name in (LIB_PATH_ENV, CHOSEN_ENV):
        monkeypatch.setenv(name, "")  # records the variable's state, so the test's changes are undone
        monkeypatch.delenv(name)
    monkeypatch.delitem(sys.modules, "llama_cpp.llama_cpp", raising=False)
    folder = tmp_path / "builds"
    folder.mkdir()
    monkeypatch.setenv(BUILDS_ENV, str(folder))
    return folder


def add_build(builds: Path, version: str, name: str = "avx512", requires: list[str] = AVX512_REQUIRES) -> Path:
    folder = builds / name
    folder.mkdir()
    (folder / "libllama.so").write_bytes(b"")
    build = {"name": name, "llama_cpp_python": version, "requires": requires, "cmake_args": "-DGGML_AVX512=ON"}
    (folder / "build.json").write_text(json.dumps(build), encoding="utf-8")
    return folder


def write_cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo_text(flags), encoding="utf-8")
    return path


def test_read_cpu_takes_the_model_and_flags_of_the_first_processor():
    cpu = read_cpu(cpuinfo_text(EPYC_FLAGS))
    assert cpu.model == "AMD EPYC"
    assert {"avx512f", "avx512_vnni", "avx512_bf16", "avx512vbmi"} <= cpu.flags and "amx_tile" not in cpu.flags
    assert read_cpu("") == CpuInfo(None, frozenset())


def test_an_avx512_cpu_gets_the_avx512_build(tmp_path, builds, installed_version):
    folder = add_build(builds, installed_version)
    cpuinfo = write_cpuinfo(tmp_path, EPYC_FLAGS)
    choice = choose_llama_cpp_build(cpuinfo)
    assert (choice.variant, choice.path, choice.cpu_model) == ("avx512", folder, "AMD EPYC")
    assert not choice.already_loaded and "has all 14 flags" in choice.reason
    assert os.environ[LIB_PATH_ENV] == str(folder)
    # again, or in a child process that inherited the variable: the same choice, not the user's
    assert choose_llama_cpp_build(cpuinfo) == choice


def test_a_cpu_without_avx512_bf16_gets_the_portable_build(tmp_path, builds, installed_version):
    add_build(builds, installed_version)
    choice = choose_llama_cpp_build(write_cpuinfo(tmp_path, EPYC_FLAGS.replace(" avx512_bf16", "")))
    assert choice.variant == PORTABLE and choice.reason == "the CPU lacks avx512_bf16 for the avx512 build"
    assert choice.path == cpu_kernels.package_lib_dir() and LIB_PATH_ENV not in os.environ


def test_no_build_installed_or_no_cpuinfo_gives_the_portable_build(tmp_path, builds, installed_version):
    choice = choose_llama_cpp_build(write_cpuinfo(tmp_path, EPYC_FLAGS))
    assert (choice.variant, choice.reason) == (PORTABLE, "no other build is installed")
    add_build(builds, installed_version)
    unreadable = choose_llama_cpp_build(tmp_path / "no-cpuinfo")  # not Linux: no flags known
    assert (unreadable.variant, unreadable.cpu_model) == (PORTABLE, None)
    assert "the CPU lacks avx" in unreadable.reason and LIB_PATH_ENV not in os.environ


def test_a_build_for_another_llama_cpp_python_version_is_not_loaded(tmp_path, builds, installed_version):
    add_build(builds, "0.0.1")
    choice = choose_llama_cpp_build(write_cpuinfo(tmp_path, EPYC_FLAGS))
    assert choice.variant == PORTABLE and f"is for llama-cpp-python 0.0.1, {installed_version} is installed" in (
        choice.reason
    )


def test_a_folder_without_a_valid_build_json_is_not_a_build(builds, installed_version):
    (builds / "empty").mkdir()
    (builds / "half-written").mkdir()
    (builds / "half-written" / "build.json").write_text('{"name": "half', encoding="utf-8")
    (builds / "flags-as-text").mkdir()
    flags_as_text = {"name": "x", "llama_cpp_python": installed_version, "requires": "avx2 fma"}
    (builds / "flags-as-text" / "build.json").write_text(json.dumps(flags_as_text), encoding="utf-8")
    good = add_build(builds, installed_version)
    assert [b.path for b in cpu_kernels.installed_builds([builds])] == [good]


def test_the_most_specialised_build_the_cpu_runs_wins(tmp_path, builds, installed_version):
    add_build(builds, installed_version, "avx2-only", ["avx2", "fma"])
    add_build(builds, installed_version, "avx512", AVX512_REQUIRES)
    add_build(builds, installed_version, "amx", [*AVX512_REQUIRES, "amx_tile"])
    assert choose_llama_cpp_build(write_cpuinfo(tmp_path, EPYC_FLAGS)).variant == "avx512"


def test_the_users_llama_cpp_lib_path_wins(tmp_path, builds, installed_version, monkeypatch):
    add_build(builds, installed_version)
    mine = tmp_path / "my-llama-build"
    monkeypatch.setenv(LIB_PATH_ENV, str(mine))
    choice = choose_llama_cpp_build(write_cpuinfo(tmp_path, EPYC_FLAGS))
    assert (choice.variant, choice.path) == ("custom", mine) and "user's choice" in choice.reason
    assert os.environ[LIB_PATH_ENV] == str(mine)


def test_once_llama_cpp_is_imported_the_choice_says_it_cannot_switch(tmp_path, builds, installed_version):
    """For real, in a child: llama_cpp imported first loads its own (portable) libraries."""
    add_build(builds, installed_version)
    probe = textwrap.dedent(
        f"""
        import json, pathlib, llama_cpp
        from hybridmem_local.llm.cpu_kernels import choose_llama_cpp_build
        choice = choose_llama_cpp_build(pathlib.Path({str(write_cpuinfo(tmp_path, EPYC_FLAGS))!r}))
        print(json.dumps([choice.variant, choice.already_loaded, choice.reason]))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in (LIB_PATH_ENV, CHOSEN_ENV)}
    env["PYTHONPATH"] = str(REPO)
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    variant, already_loaded, reason = json.loads(child.stdout.splitlines()[-1])
    assert (variant, already_loaded) == (PORTABLE, True)
    assert "imported before the choice" in reason and "would get the avx512 build" in reason


def test_simd_features_lists_what_llama_cpp_reports_on():
    info = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | "
    assert simd_features(info) == ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "LLAMAFILE"]
    assert simd_features("CPU : AVX = 0 | AVX512 = 1 |") == ["AVX512"]


@pytest.mark.slow
def test_the_installed_avx512_build_loads_avx512_kernels_on_an_avx512_cpu(installed_version):
    """The venv's own builds, chosen and loaded in a fresh process as the llamacpp backend does."""
    cpu = cpu_kernels.read_cpu_file()
    build = next((b for b in cpu_kernels.installed_builds(cpu_kernels.builds_dirs()) if b.name == "avx512"), None)
    if build is None:
        pytest.skip("no avx512 build in the venv (scripts/build_llama_cpp_avx512.sh makes it)")
    if missing := build.requires - cpu.flags:
        pytest.skip(f"this CPU ({cpu.model}) lacks {' '.join(sorted(missing))}: it runs the portable build")
    probe = textwrap.dedent(
        """
        import json
        from hybridmem_local.llm.cpu_kernels import choose_llama_cpp_build, llama_cpp_system_info
        choice = choose_llama_cpp_build()
        info = llama_cpp_system_info()
        maps = open("/proc/self/maps").read().split()
        print(json.dumps([choice.variant, info, sorted({p for p in maps if "libggml-cpu" in p})]))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in (LIB_PATH_ENV, CHOSEN_ENV, BUILDS_ENV)}
    env["PYTHONPATH"] = str(REPO)
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    variant, info, ggml_cpu = json.loads(child.stdout.splitlines()[-1])
    assert variant == "avx512"
    assert {"AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"} <= set(simd_features(info)), info
    assert "AMX" not in info
    # the kernels come from the build's folder, not from llama_cpp/lib
    assert ggml_cpu and {Path(p).parent for p in ggml_cpu} == {build.path.resolve()}
