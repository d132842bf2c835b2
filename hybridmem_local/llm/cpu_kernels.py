"""Which llama.cpp build runs: the portable AVX2 libraries llama-cpp-python installed, or an extra
build for a newer instruction set when this CPU has every flag that build was compiled for.

llama-cpp-python loads its shared libraries once, at ``import llama_cpp``, from the folder
``LLAMA_CPP_LIB_PATH`` names (else its own ``llama_cpp/lib``). :func:`choose_llama_cpp_build`
reads the CPU's flags from ``/proc/cpuinfo`` and sets that variable before the import. Extra builds
are folders of shared libraries, each with a ``build.json`` naming the llama-cpp-python version
they were built from and the cpuinfo flags they require::

    <sys.prefix>/share/hybridmem/llama-cpp/avx512/{libllama.so, libggml*.so, ..., build.json}

``scripts/build_llama_cpp_avx512.sh`` (run by ``scripts/install.sh``) makes the one above;
``$HYBRIDMEM_LLAMA_CPP_BUILDS`` names another folder of builds to search instead. A CPU lacking a
flag, a build for another llama-cpp-python version, or no cpuinfo at all (not Linux) gives the
portable build: a library compiled for instructions the CPU lacks would die of SIGILL. AMX is
built into none (its tiles need a per-thread permission from the kernel).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

#: The variable llama-cpp-python reads its library folder from, at import.
LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"
#: A folder of builds (one sub-folder each) searched instead of the venv's own.
BUILDS_ENV = "HYBRIDMEM_LLAMA_CPP_BUILDS"
#: The folder this module last put in ``LLAMA_CPP_LIB_PATH``. Child processes inherit both, so a
#: value equal to this one is this module's choice (made again); any other is the user's (kept).
CHOSEN_ENV = "HYBRIDMEM_LLAMA_CPP_CHOSEN"
#: The marker file of a build folder.
BUILD_FILE = "build.json"
#: The name of the libraries llama-cpp-python installed with itself (AVX/AVX2/FMA/F16C).
PORTABLE = "portable"
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuInfo:
    """The CPU as /proc/cpuinfo describes its first processor."""

    model: str | None
    flags: frozenset[str]


class Build(BaseModel):
    """An extra llama.cpp build: a folder of shared libraries and, from its ``build.json``, the
    cpuinfo flags they need and the llama-cpp-python version they were built from."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: Path
    requires: frozenset[str]
    llama_cpp_python: str


@dataclass(frozen=True)
class KernelChoice:
    """The llama.cpp build this process loads, and why."""

    variant: str  #: a build's name, ``portable``, or ``custom`` (a folder of the user's)
    path: Path | None  #: the folder the libraries load from; None without llama-cpp-python
    cpu_model: str | None
    reason: str
    already_loaded: bool = False  #: llama_cpp was imported first: nothing could be switched


def read_cpu(text: str) -> CpuInfo:
    """The model name and flags of the first processor in /proc/cpuinfo's ``text``."""
    model: str | None = None
    flags: frozenset[str] | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = frozenset(value.split())
    return CpuInfo(model, flags or frozenset())


def read_cpu_file(path: Path = CPUINFO) -> CpuInfo:
    """:func:`read_cpu` of ``path``; no model and no flags where it cannot be read (not Linux)."""
    try:
        return read_cpu(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return CpuInfo(None, frozenset())


def builds_dirs() -> list[Path]:
    """Where extra builds are looked for: ``$HYBRIDMEM_LLAMA_CPP_BUILDS`` if set, else the venv's."""
    override = os.environ.get(BUILDS_ENV)
    return [Path(override)] if override else [Path(sys.prefix) / "share" / "hybridmem" / "llama-cpp"]


def installed_builds(dirs: Iterable[Path]) -> list[Build]:
    """The builds in ``dirs``: each sub-folder with a readable ``build.json`` (others are skipped)."""
    builds = []
    for folder in dirs:
        for marker in sorted(folder.glob(f"*/{BUILD_FILE}")):
            try:
                builds.append(
                    Build.model_validate({**json.loads(marker.read_text(encoding="utf-8")), "path": marker.parent})
                )
            except (OSError, ValueError, TypeError, ValidationError):
                continue  # a half-written or foreign folder: not a build to load
    return builds


def pick_build(cpu: CpuInfo, builds: Iterable[Build], llama_cpp_python: str) -> tuple[Build | None, str]:
    """The most specialised build (most required flags) the CPU runs that matches the installed
    llama-cpp-python version, or None for the portable one; and why."""
    usable, rejected = [], []
    for build in builds:
        missing = build.requires - cpu.flags
        if build.llama_cpp_python != llama_cpp_python:
            rejected.append(
                f"the {build.name} build is for llama-cpp-python {build.llama_cpp_python}, "
                f"{llama_cpp_python} is installed (scripts/install.sh rebuilds it)"
            )
        elif missing:
            rejected.append(f"the CPU lacks {' '.join(sorted(missing))} for the {build.name} build")
        else:
            usable.append(build)
    if usable:
        best = max(usable, key=lambda b: (len(b.requires), b.name))
        return best, f"the CPU has all {len(best.requires)} flags the {best.name} build needs"
    return None, "; ".join(rejected) or "no other build is installed"


def package_lib_dir() -> Path | None:
    """llama-cpp-python's own library folder (the portable build), found without importing it."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "lib"


def _variant_at(path: Path | None, builds: list[Build]) -> str:
    """The name of the build whose libraries are in ``path``."""
    if path is None:
        return "unknown"
    package = package_lib_dir()
    if package is not None and path.resolve() == package.resolve():
        return PORTABLE
    return next((b.name for b in builds if b.path.resolve() == path.resolve()), "custom")


def choose_llama_cpp_build(cpuinfo: Path = CPUINFO) -> KernelChoice:
    """Point llama-cpp-python at the best build for this CPU; call it before ``import llama_cpp``.

    Sets ``LLAMA_CPP_LIB_PATH`` to the chosen build's folder (leaves it unset for the portable
    build), unless the user set it (their choice is kept and reported). Idempotent. Once
    llama_cpp has been imported its libraries stay loaded: the choice then reports the folder
    they came from, with ``already_loaded`` set.
    """
    cpu = read_cpu_file(cpuinfo)
    builds = installed_builds(builds_dirs())
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return KernelChoice(PORTABLE, None, cpu.model, "llama-cpp-python is not installed")
    build, reason = pick_build(cpu, builds, version)
    loaded = sys.modules.get("llama_cpp.llama_cpp")  # the module that loads the libraries
    if loaded is not None:
        base = getattr(loaded, "_base_path", None)  # llama-cpp-python's name for the folder it loaded
        path = Path(base) if base is not None else None
        best = build.name if build else PORTABLE
        return KernelChoice(
            variant=_variant_at(path, builds),
            path=path,
            cpu_model=cpu.model,
            reason=f"llama_cpp was imported before the choice, so its libraries stay loaded in this process "
            f"(this CPU would get the {best} build)",
            already_loaded=True,
        )
    user_path = os.environ.get(LIB_PATH_ENV)
    if user_path and user_path != os.environ.get(CHOSEN_ENV):
        path = Path(user_path)
        return KernelChoice(_variant_at(path, builds), path, cpu.model, f"{LIB_PATH_ENV} is set (the user's choice)")
    if build is None:
        for name in (LIB_PATH_ENV, CHOSEN_ENV):  # never the user's value here: that returned above
            os.environ.pop(name, None)
        return KernelChoice(PORTABLE, package_lib_dir(), cpu.model, reason)
    os.environ[LIB_PATH_ENV] = os.environ[CHOSEN_ENV] = str(build.path)
    return KernelChoice(build.name, build.path, cpu.model, reason)


def llama_cpp_system_info() -> str:
    """llama.cpp's own report on the loaded build (``CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | ...``):
    the SIMD kernels compiled into it. Imports llama_cpp, after :func:`choose_llama_cpp_build`."""
    choose_llama_cpp_build()
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def simd_features(system_info: str) -> list[str]:
    """The features :func:`llama_cpp_system_info` reports on (``AVX2 = 1``), in its order."""
    features = []
    for part in system_info.split("|"):
        name, _, value = part.rpartition("=")
        name = name.split(":")[-1].strip()  # the first feature follows the backend's name
        if name and value.strip() == "1":
            features.append(name)
    return features
