"""Encryption at rest on real SQLCipher files and real AES-GCM: every wrong-key case is a clear
error that writes nothing; a damaged page is caught, never read as data; ``encrypt`` and
``master-key rotate`` convert a store with its LLM cache and exports; no planted text is
readable in any file of an encrypted store (index files aside: see the forget tests); and the
commands through the CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from hybridmem_local.cli.main import app
from hybridmem_local.errors import EncryptionKeyError, StoreError
from hybridmem_local.files.sealing import MAGIC
from hybridmem_local.memory import HybridMemory
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.paths import indexes_path, keyid_path, llm_cache_path
from hybridmem_local.storage.rekey import check_store, encrypt_store, rotate_key
from hybridmem_local.storage.store import MemoryStore
from tests.encrypted_stores import (
    add_cache_entries,
    cache_rows,
    config_for,
    fill_store,
    open_llm_cache,
    opens_with,
    plant_llm_cache,
    snapshot,
    write_key_file,
)

MARKERS = ["ZQXWTURNONE", "ZQXWTURNTWO", "ZQXWEPISODE", "ZQXWTUPLEOBJ"]
CACHE_MARKER = "ZQXWCACHEENTRY"


@pytest.fixture(autouse=True)
def no_ambient_key(monkeypatch):
    """Only the key a test gives counts: none from the environment or a systemd credential."""
    monkeypatch.delenv(encryption.KEY_ENV, raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)


@pytest.fixture
def keyring(tmp_path) -> Path:
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o700)
    return folder


@pytest.fixture
def store_dir(tmp_path) -> Path:
    folder = tmp_path / "store"
    folder.mkdir()
    return folder


def make_store(folder: Path, key_file: Path | None, keys: StoreKeys | None) -> Path:
    """A store in ``folder`` (encrypted when ``key_file`` is given) with markers in turns and
    memories, an LLM-cache entry, an export and index files."""
    db = folder / "memory.db"
    with HybridMemory.open(db, config_for(key_file)) as memory:
        fill_store(memory, "alice", MARKERS)
        memory.search("code word", namespace="alice")
        memory.export("alice", folder / "alice.export")
    plant_llm_cache(db, keys, CACHE_MARKER)
    return db


def row_count(db: Path, key_file: Path | None) -> dict[str, int]:
    with HybridMemory.open(db, config_for(key_file)) as memory:
        return memory.store.counts()


# --------------------------------------------------------------------------- keys at open


def stored_texts(db: Path, key_file: Path | None) -> list[str]:
    """Every memory's and every turn's text of alice's, sorted."""
    with HybridMemory.open(db, config_for(key_file)) as memory:
        memories = [m.index_text() for m in memory.list("alice")]
        turns = [t.text for record in memory.store.sessions.select("alice") for t in record.session.turns]
    return sorted(memories + turns)


def test_an_encrypted_store_opens_with_its_key_and_reads_back(store_dir, keyring):
    key_file = keyring / "master.key"
    keys = write_key_file(key_file)
    db = make_store(store_dir, key_file, keys)
    assert encryption.is_encrypted(db) and encryption.is_encrypted(llm_cache_path(db))
    assert encryption.recorded_key_id(db) == keys.key_id
    texts = stored_texts(db, key_file)
    assert all(any(marker in text for text in texts) for marker in MARKERS)
    assert cache_rows(db, keys) == 1


def _wrong_key(store_dir, keyring):
    write_key_file(keyring / "other.key")
    return config_for(keyring / "other.key"), "wrong key or a damaged file"


def _missing_key(store_dir, keyring):
    return config_for(keyring / "absent.key"), (
        r"looked in: \$CREDENTIALS_DIRECTORY \(unset\), store.key_file .*absent.key \(missing\), "
        r"\$HYBRIDMEM_MASTER_KEY \(unset\)"
    )


def _loose_key_file(store_dir, keyring):
    os.chmod(keyring / "master.key", 0o644)
    return config_for(keyring / "master.key"), "readable by group or others"


def _no_key_for_encrypted(store_dir, keyring):
    return config_for(None), "it is encrypted"


def _garbage_key(store_dir, keyring):
    (keyring / "garbage.key").write_text("not a key at all\n")
    os.chmod(keyring / "garbage.key", 0o600)
    return config_for(keyring / "garbage.key"), "is not 32 raw bytes, 64 hex digits or base64"


@pytest.mark.parametrize(
    "case", [_wrong_key, _missing_key, _loose_key_file, _no_key_for_encrypted, _garbage_key], ids=lambda f: f.__name__
)
def test_a_bad_key_for_an_encrypted_store_is_a_clear_error_that_writes_nothing(store_dir, keyring, case):
    key_file = keyring / "master.key"
    db = make_store(store_dir, key_file, write_key_file(key_file))
    before = snapshot(store_dir)
    config, message = case(store_dir, keyring)
    with pytest.raises(EncryptionKeyError, match=message):
        HybridMemory.open(db, config)
    assert snapshot(store_dir) == before


def test_a_key_for_a_plaintext_store_is_a_clear_error_that_writes_nothing(store_dir, keyring):
    db = make_store(store_dir, None, None)
    write_key_file(keyring / "master.key")
    before = snapshot(store_dir)
    with pytest.raises(EncryptionKeyError, match="it is not encrypted; run `hybridmem encrypt"):
        HybridMemory.open(db, config_for(keyring / "master.key"))
    assert snapshot(store_dir) == before


def vacuumed(db: Path, keys: StoreKeys) -> tuple[int, int]:
    """Checkpoint and vacuum the store (every page in the main file); (page size, page count)."""
    store = MemoryStore(db, keys=keys)
    try:
        store.scrub()
        return (
            int(store.sqlite.execute("PRAGMA page_size").fetchone()[0]),
            int(store.sqlite.execute("PRAGMA page_count").fetchone()[0]),
        )
    finally:
        store.close()


def flip_bit(path: Path, offset: int, bit: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= bit
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("page", [2, 3])
def test_a_bit_flipped_page_is_caught_never_read_as_data(store_dir, keyring, page):
    key_file = keyring / "master.key"
    keys = write_key_file(key_file)
    db = make_store(store_dir, key_file, keys)
    written = stored_texts(db, key_file)
    page_size, pages = vacuumed(db, keys)
    assert pages > page and check_store(db, keys).ok
    flip_bit(db, (page - 1) * page_size + 200)

    report = check_store(db, keys)
    assert not report.ok
    assert "fail SQLCipher's HMAC check" in report.database.status
    # Reading every row fails loudly or returns exactly what was written, never other bytes.
    try:
        read = stored_texts(db, key_file)
    except (StoreError, sa.exc.DatabaseError):
        return
    assert read == written


def test_a_bit_flipped_first_page_fails_at_open(store_dir, keyring):
    key_file = keyring / "master.key"
    keys = write_key_file(key_file)
    db = make_store(store_dir, key_file, keys)
    vacuumed(db, keys)
    flip_bit(db, 100, 0x80)
    with pytest.raises(EncryptionKeyError, match="wrong key or a damaged file"):
        HybridMemory.open(db, config_for(key_file))


# --------------------------------------------------------------------------- exports


def test_an_encrypted_store_seals_its_exports_and_imports_them_back(store_dir, keyring):
    key_file = keyring / "master.key"
    keys = write_key_file(key_file)
    db = make_store(store_dir, key_file, keys)
    blob = (store_dir / "alice.export").read_bytes()
    assert blob.startswith(MAGIC) and not any(marker.encode() in blob for marker in MARKERS)
    with HybridMemory.open(db, config_for(key_file)) as memory:
        assert memory.import_(store_dir / "alice.export", namespace="bob") == {"sessions": 1, "memories": 2}
        assert sorted(m.index_text() for m in memory.list("bob")) == sorted(
            m.index_text() for m in memory.list("alice")
        )


def test_a_plaintext_store_writes_plaintext_jsonl_exports(store_dir):
    db = make_store(store_dir, None, None)
    lines = (store_dir / "alice.export").read_text().splitlines()
    assert [json.loads(line)["type"] for line in lines] == ["session", "memory", "memory"]
    with HybridMemory.open(db, config_for(None)) as memory:
        assert memory.import_(store_dir / "alice.export", namespace="bob") == {"sessions": 1, "memories": 2}


@pytest.mark.parametrize("importer", ["plaintext", "other key"])
def test_a_sealed_export_without_its_key_is_a_clear_error_and_imports_nothing(tmp_path, store_dir, keyring, importer):
    key_file = keyring / "master.key"
    make_store(store_dir, key_file, write_key_file(key_file))
    other_key = None
    if importer == "other key":
        other_key = keyring / "other.key"
        write_key_file(other_key)
    target = tmp_path / "target.db"
    message = "a sealed \\(encrypted\\) export" if other_key is None else "sealed with another key"
    with HybridMemory.open(target, config_for(other_key)) as memory:
        with pytest.raises(EncryptionKeyError, match=message):
            memory.import_(store_dir / "alice.export", namespace="bob")
        assert memory.store.counts() == {"sessions": 0, "turns": 0}


# --------------------------------------------------------------------------- encrypt and rotate


def test_encrypt_converts_a_plaintext_store_with_its_cache_and_exports(store_dir, keyring):
    db = make_store(store_dir, None, None)
    written = stored_texts(db, None)
    keys = write_key_file(keyring / "master.key")
    (store_dir / "memory.db.encrypting").write_bytes(b"left over by a crashed run")

    report = encrypt_store(db, keys)

    assert report.database and report.llm_cache and report.indexes_removed
    assert report.exports_sealed == [str(store_dir / "alice.export")]
    assert not (store_dir / "memory.db.encrypting").exists() and not indexes_path(db).exists()
    assert opens_with(db, keys) and not opens_with(db, None)
    assert opens_with(llm_cache_path(db), keys) and not opens_with(llm_cache_path(db), None)
    assert (store_dir / "alice.export").read_bytes().startswith(MAGIC)
    assert stored_texts(db, keyring / "master.key") == written
    assert cache_rows(db, keys) == 1
    assert check_store(db, keys).ok
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    with pytest.raises(EncryptionKeyError, match="is already encrypted"):
        encrypt_store(db, keys)


REPO = Path(__file__).resolve().parents[2]


#: Opens the store (argv: db, key file or "") and holds it open until its stdin closes.
def content_files(folder: Path) -> dict[str, tuple[int, str]]:
    """:func:`snapshot` without the ``-shm`` WAL index: it holds no content, and any reader of a
    WAL with frames in it (the holder's audit entry) updates its read marks."""
    return {name: digest for name, digest in snapshot(folder).items() if not name.endswith("-shm")}


HOLD_OPEN = """
import sys
from hybridmem_local.memory import HybridMemory
from tests.encrypted_stores import config_for
with HybridMemory.open(sys.argv[1], config_for(sys.argv[2] or None)) as memory:
    memory.list("alice")
    print("open", flush=True)
    sys.stdin.read()
"""


@pytest.mark.parametrize("operation", ["encrypt", "rotate"])
def test_encrypt_and_rotate_refuse_while_the_store_is_open_and_change_nothing(store_dir, keyring, operation):
    old_file = keyring / "master.key"
    old = write_key_file(old_file)
    new = write_key_file(keyring / "new.key")
    key_file = None if operation == "encrypt" else old_file
    db = make_store(store_dir, key_file, None if key_file is None else old)
    # Another process (stdlib sqlite3 and sqlcipher3 in one process do not see each other's locks).
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OPEN, str(db), str(key_file or "")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        before = content_files(store_dir)
        with pytest.raises(StoreError, match="is open in another process"):
            encrypt_store(db, old) if operation == "encrypt" else rotate_key(db, old, new)
        assert content_files(store_dir) == before
    finally:
        holder.communicate(timeout=60)


def test_rotate_re_encrypts_store_cache_and_exports_under_the_new_key(store_dir, keyring):
    old_file, new_file = keyring / "master.key", keyring / "new.key"
    old, new = write_key_file(old_file), write_key_file(new_file)
    db = make_store(store_dir, old_file, old)
    written = stored_texts(db, old_file)

    report = rotate_key(db, old, new)

    assert report.database and report.llm_cache and report.indexes_removed
    assert report.exports_resealed == [str(store_dir / "alice.export")]
    for path in (db, llm_cache_path(db)):
        assert opens_with(path, new) and not opens_with(path, old)
    assert encryption.recorded_key_id(db) == new.key_id
    assert stored_texts(db, new_file) == written
    with HybridMemory.open(db, config_for(new_file)) as memory:
        assert memory.import_(store_dir / "alice.export", namespace="bob")["memories"] == 2
    with pytest.raises(EncryptionKeyError, match="already uses the new key"):
        rotate_key(db, old, new)
    with pytest.raises(EncryptionKeyError, match="is the key in use"):
        rotate_key(db, new, new)


def test_check_names_a_cache_left_under_the_other_key(store_dir, keyring):
    """What an interrupted rotation leaves (the cache goes first): check says so; rotate again finishes."""
    old_file, new_file = keyring / "master.key", keyring / "new.key"
    old, new = write_key_file(old_file), write_key_file(new_file)
    db = make_store(store_dir, old_file, old)
    cache = encryption.connect(llm_cache_path(db), old)
    cache.execute(f"PRAGMA rekey = \"x'{new.sqlcipher.hex()}'\"")
    cache.close()

    report = check_store(db, old)
    assert report.database.ok and not report.ok
    assert report.llm_cache is not None and "an interrupted `hybridmem master-key rotate`" in report.llm_cache.status
    finished = rotate_key(db, old, new)
    assert finished.database and not finished.llm_cache
    assert check_store(db, new).ok


def test_rotate_rerun_records_the_new_key_of_a_file_rekeyed_before_its_sidecar(store_dir, keyring):
    """A rotation killed after the database's rekey but before its sidecar's rename: every file
    opens with the new key, so the rerun has nothing to re-encrypt, yet it records the key id."""
    old_file, new_file = keyring / "master.key", keyring / "new.key"
    old, new = write_key_file(old_file), write_key_file(new_file)
    db = make_store(store_dir, old_file, old)
    rotate_key(db, old, new)
    keyid_path(db).write_text(old.key_id + "\n")

    with pytest.raises(EncryptionKeyError, match="already uses the new key"):
        rotate_key(db, old, new)

    assert encryption.recorded_key_id(db) == new.key_id
    assert check_store(db, new).ok


# --------------------------------------------------------------------------- forensic


def _readable_markers(folder: Path, markers: list[str]) -> list[str]:
    """``file: marker`` for each marker found in any file's bytes (UTF-8 or UTF-16-LE), index files aside."""
    found = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or indexes_path(folder / "memory.db") in path.parents:
            continue
        data = path.read_bytes()
        found += [
            f"{path.name}: {marker}"
            for marker in markers
            if marker.encode() in data or marker.encode("utf-16-le") in data
        ]
    return found


def test_no_planted_text_is_readable_in_any_file_of_an_encrypted_store(store_dir, keyring):
    key_file = keyring / "master.key"
    keys = write_key_file(key_file)
    markers = [*MARKERS, CACHE_MARKER, "ZQXWLATEWALTURN", "ZQXWLATEEPISODE", "ZQXWLATECACHE"]
    db = make_store(store_dir, key_file, keys)
    assert _readable_markers(store_dir, markers[:4]) == []
    # While open, with the latest writes still in the WAL files.
    memory = HybridMemory.open(db, config_for(key_file))
    cache = open_llm_cache(db, keys)
    try:
        fill_store(memory, "carol", [markers[5], markers[5], markers[6], markers[6]])
        add_cache_entries(cache, markers[7])
        assert Path(f"{db}-wal").stat().st_size > 0 and Path(f"{llm_cache_path(db)}-wal").stat().st_size > 0
        assert _readable_markers(store_dir, markers) == []
        # The control: the same check finds them in a plaintext store.
        plain = store_dir.parent / "plain"
        plain.mkdir()
        make_store(plain, None, None)
        assert len(_readable_markers(plain, [*MARKERS, CACHE_MARKER])) >= 5
    finally:
        cache.close()
        memory.close()
    assert _readable_markers(store_dir, markers) == []


# --------------------------------------------------------------------------- the commands


def cli(*args: str, ok: bool = True):
    result = CliRunner().invoke(app, list(args))
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 1, result.output
    return result


def test_master_key_create_writes_an_owner_only_key_once(keyring):
    out = keyring / "master.key"
    result = cli("master-key", "create", "--out", str(out))
    keys = StoreKeys(encryption.read_key_file(out), str(out))
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert keys.key_id in result.stdout and "hybridmem-master-key" in result.stdout
    assert keys.master.hex() not in result.stdout
    before = out.read_bytes()
    assert "never overwritten" in cli("master-key", "create", "--out", str(out), ok=False).output
    assert out.read_bytes() == before


def test_encrypt_check_rotate_through_the_cli(store_dir, keyring, hashing_cli):
    db = make_store(store_dir, None, None)
    key_file, new_file = keyring / "master.key", keyring / "new.key"
    cli("master-key", "create", "--out", str(key_file))
    cli("master-key", "create", "--out", str(new_file))
    key_set = ["--set", f"store.key_file={key_file}"]

    cli("encrypt", "--db", str(db), *key_set)
    assert "already encrypted" in cli("encrypt", "--db", str(db), *key_set, ok=False).output
    checked = json.loads(cli("master-key", "check", "--db", str(db), *key_set, "--json").stdout)
    assert checked["database"]["status"] == "ok" and checked["llm_cache"]["status"] == "ok"
    assert checked["key_source"] == str(key_file)
    assert (
        "wrong key"
        in cli("master-key", "check", "--db", str(db), "--set", f"store.key_file={new_file}", ok=False).output
    )

    # Every command that opens the store honours store.encryption, the API-key commands too.
    encrypted = ["--set", "store.encryption=sqlcipher", *key_set]
    cli("keys", "create", "--namespace", "alice", "--role", "read", "--db", str(db), *encrypted)
    assert "it is encrypted" in cli("keys", "list", "--db", str(db), ok=False).output
    assert len(json.loads(cli("keys", "list", "--db", str(db), *encrypted, "--json").stdout)) == 1
    assert json.loads(cli("list", "-n", "alice", "--db", str(db), *encrypted, "--json").stdout)

    rotated = json.loads(
        cli("master-key", "rotate", "--db", str(db), "--new-key-file", str(new_file), *key_set, "--json").stdout
    )
    assert rotated["new_key_id"] == StoreKeys(encryption.read_key_file(new_file)).key_id
    cli("master-key", "check", "--db", str(db), "--set", f"store.key_file={new_file}")
    assert "wrong key" in cli("list", "-n", "alice", "--db", str(db), *encrypted, ok=False).output


def test_master_key_check_fails_on_a_damaged_page(store_dir, keyring):
    key_file = keyring / "master.key"
    keys = write_key_file(key_file)
    db = make_store(store_dir, key_file, keys)
    page_size, _ = vacuumed(db, keys)
    flip_bit(db, 2 * page_size + 300)
    output = cli("master-key", "check", "--db", str(db), "--set", f"store.key_file={key_file}", ok=False).output
    assert "HMAC check" in output
