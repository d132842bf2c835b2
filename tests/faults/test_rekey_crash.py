"""SIGKILL in the middle of ``encrypt`` and ``master-key rotate`` (storage/rekey.py), at seeded
random moments: afterwards the database, its LLM cache and its export each open with exactly
one of the two keys (for ``encrypt``: plaintext xor encrypted), with every row and
``integrity_check`` ok, and running the same operation again finishes it (design note §5).

The child process imports everything, says ``ready``, then runs the operation; the parent
kills it after a delay drawn uniformly over the operation's measured duration."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridmem_local.errors import EncryptionKeyError, SealError
from hybridmem_local.files.sealing import is_sealed, unseal
from hybridmem_local.files.session_files import EXPORT_CONTEXT
from hybridmem_local.memory import HybridMemory
from hybridmem_local.storage import encryption
from hybridmem_local.storage.encryption import StoreKeys
from hybridmem_local.storage.paths import llm_cache_path
from hybridmem_local.storage.rekey import check_store, encrypt_store, rotate_key
from hybridmem_local.storage.store import MemoryStore
from tests.encrypted_stores import config_for, fill_store, marker_session, opens_with, plant_llm_cache, write_key_file

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TRIALS = 6
CACHE_ROWS = 2000

#: argv: operation (encrypt | rotate), db, key file, new key file (rotate).
CHILD = """
import sys, time
from hybridmem_local.storage.encryption import StoreKeys, read_key_file
from hybridmem_local.storage.rekey import encrypt_store, rotate_key
operation, db, key_file = sys.argv[1:4]
keys = StoreKeys(read_key_file(__import__("pathlib").Path(key_file)), key_file)
if operation == "rotate":
    new = StoreKeys(read_key_file(__import__("pathlib").Path(sys.argv[4])), sys.argv[4])
print("ready", flush=True)
started = time.perf_counter()
encrypt_store(db, keys) if operation == "encrypt" else rotate_key(db, keys, new)
print(f"done {time.perf_counter() - started:.4f}", flush=True)
"""


@pytest.fixture(scope="module")
def plain_store(tmp_path_factory) -> Path:
    """A plaintext store of ~3 MB (sessions, memories, an export, index files) and a ~1 MB LLM cache."""
    folder = tmp_path_factory.mktemp("plain")
    db = folder / "memory.db"
    with HybridMemory.open(db, config_for(None)) as memory:
        fill_store(memory, "alice", ["ZQXWONE", "ZQXWTWO", "ZQXWTHREE", "ZQXWFOUR"])
        with memory.store.transaction():
            for i in range(60):
                memory.store.sessions.insert(marker_session("bulk", f"b{i}", [f"m{i}-{j}" for j in range(20)], 2000))
        memory.export("alice", folder / "alice.export")
    plant_llm_cache(db, None, "cached reply " + "x" * 400, rows=CACHE_ROWS)
    return db


@pytest.fixture(scope="module")
def key_files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("keys")
    write_key_file(folder / "old.key")
    write_key_file(folder / "new.key")
    return folder / "old.key", folder / "new.key"


def keys_of(path: Path) -> StoreKeys:
    return StoreKeys(encryption.read_key_file(path), str(path))


@pytest.fixture(scope="module")
def encrypted_store(plain_store, key_files, tmp_path_factory) -> Path:
    db = copy_store(plain_store, tmp_path_factory.mktemp("encrypted"), None)
    encrypt_store(db, keys_of(key_files[0]))
    return db


def copy_store(db: Path, folder: Path, keys: StoreKeys | None) -> Path:
    """The store's files copied into ``folder``, its export re-pointed at the copy's."""
    for path in db.parent.iterdir():
        if path.is_file():
            shutil.copy2(path, folder / path.name)
    copy = folder / db.name
    conn = encryption.connect(copy, keys)
    try:
        with conn:
            conn.execute("UPDATE exports SET path = ?", (str(folder / "alice.export"),))
    finally:
        conn.close()
    return copy


def expected_counts(db: Path, keys: StoreKeys | None) -> dict[str, int]:
    store = MemoryStore(db, keys=keys)
    try:
        assert store.integrity_check() == "ok"
        return store.counts()
    finally:
        store.close()


def run_and_kill(args: list[str], delay_s: float | None) -> float | None:
    """Run the child; kill it ``delay_s`` after it is ready (None: let it finish, return its time)."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready", child.communicate()[1]
    if delay_s is None:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        return float(out.split()[-1])
    time.sleep(delay_s)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    assert child.returncode in (0, -signal.SIGKILL)
    return None


def the_one_that_opens(path: Path, candidates: list[StoreKeys | None], reverse: bool) -> StoreKeys | None:
    """The one candidate (None: plaintext) that opens ``path``; asserts there is exactly one."""
    order = list(reversed(candidates)) if reverse else candidates
    opening = [keys for keys in order if opens_with(path, keys)]
    assert len(opening) == 1, f"{path.name} opens with {len(opening)} of the candidates"
    return opening[0]


def export_key(path: Path, candidates: list[StoreKeys | None]) -> StoreKeys | None:
    blob = path.read_bytes()
    if not is_sealed(blob):
        assert None in candidates
        return None
    opening = []
    for keys in candidates:
        if keys is None:
            continue
        try:
            unseal(keys.files, EXPORT_CONTEXT, blob)
            opening.append(keys)
        except SealError:
            pass
    assert len(opening) == 1
    return opening[0]


def assert_whole(db: Path, candidates: list[StoreKeys | None], counts: dict[str, int], reverse: bool) -> dict:
    """Each file opens with exactly one candidate, with all its rows and integrity ok."""
    found = {
        "db": the_one_that_opens(db, candidates, reverse),
        "cache": the_one_that_opens(llm_cache_path(db), candidates, reverse),
        "export": export_key(db.parent / "alice.export", candidates),
    }
    assert expected_counts(db, found["db"]) == counts
    cache = encryption.connect(llm_cache_path(db), found["cache"])
    try:
        assert cache.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert cache.execute("SELECT count(*) FROM llm_calls").fetchone()[0] == CACHE_ROWS
    finally:
        cache.close()
    return found


def delays(operation_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    # A little past the end too: some trials see the whole operation done and the rerun refuse.
    return [rng.uniform(0, operation_s * 1.3) for _ in range(TRIALS)]


def test_encrypt_killed_at_random_points_leaves_plaintext_xor_encrypted_and_finishes_when_rerun(
    plain_store, key_files, tmp_path
):
    keys = keys_of(key_files[0])
    counts = expected_counts(plain_store, None)
    calibration = copy_store(plain_store, _folder(tmp_path, "calibration"), None)
    duration = run_and_kill(["encrypt", str(calibration), str(key_files[0])], None)
    assert duration is not None
    outcomes = []
    for trial, delay in enumerate(delays(duration, seed=25)):
        db = copy_store(plain_store, _folder(tmp_path, f"trial{trial}"), None)
        run_and_kill(["encrypt", str(db), str(key_files[0])], delay)
        found = assert_whole(db, [None, keys], counts, reverse=trial % 2 == 1)
        outcomes.append("encrypted" if found["db"] is keys else "plaintext")
        try:
            encrypt_store(db, keys)
        except EncryptionKeyError as exc:
            assert "already encrypted" in str(exc)
        assert assert_whole(db, [None, keys], counts, reverse=False) == {"db": keys, "cache": keys, "export": keys}
        assert check_store(db, keys).ok
        assert not Path(f"{db}.encrypting").exists()
    print("encrypt outcomes:", outcomes, f"(operation {duration * 1000:.0f} ms)")


def test_rotate_killed_at_random_points_leaves_one_key_per_file_and_finishes_when_rerun(
    encrypted_store, key_files, tmp_path
):
    old, new = keys_of(key_files[0]), keys_of(key_files[1])
    counts = expected_counts(encrypted_store, old)
    calibration = copy_store(encrypted_store, _folder(tmp_path, "calibration"), old)
    duration = run_and_kill(["rotate", str(calibration), *map(str, key_files)], None)
    assert duration is not None
    outcomes = []
    for trial, delay in enumerate(delays(duration, seed=26)):
        db = copy_store(encrypted_store, _folder(tmp_path, f"trial{trial}"), old)
        run_and_kill(["rotate", str(db), *map(str, key_files)], delay)
        found = assert_whole(db, [old, new], counts, reverse=trial % 2 == 1)
        outcomes.append("/".join("new" if keys is new else "old" for keys in found.values()))
        try:
            rotate_key(db, old, new)
        except EncryptionKeyError as exc:
            assert "already uses the new key" in str(exc)
        assert assert_whole(db, [old, new], counts, reverse=False) == {"db": new, "cache": new, "export": new}
        assert check_store(db, new).ok and encryption.recorded_key_id(db) == new.key_id
    print("rotate outcomes (db/cache/export):", outcomes, f"(operation {duration * 1000:.0f} ms)")


def _folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder
