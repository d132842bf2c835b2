"""Bundles carry models to machines without internet (``hybridmem models bundle`` /
``install-bundle``): one tar holding ``manifest.yaml`` (the bundled entries), ``SHA256SUMS``
(``sha256sum -c`` format) and ``<name>/<file>`` members, every file verified on both ends."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import yaml
from pydantic import ValidationError

from hybridmem_local.errors import BundleError
from hybridmem_local.weights.folders import default_models_dir
from hybridmem_local.weights.manifest import Frozen, Manifest, ModelEntry, load_manifest
from hybridmem_local.weights.resolve import READ_CHUNK, verify

BUNDLE_MANIFEST = "manifest.yaml"
BUNDLE_CHECKSUMS = "SHA256SUMS"


class BundleReport(Frozen):
    path: Path
    models: list[str]
    files: int
    bytes: int


class InstallReport(Frozen):
    bundle: Path
    models_dir: Path
    models: list[str]
    files: int
    bytes: int


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
        while chunk := source.read(READ_CHUNK):
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
