"""Forensic tests of forget and of encryption at rest (issue #25): unique markers are planted in
turns, memories, queries and answers of two namespaces, and every file under the store's folder
is searched for them — raw bytes (any case), UTF-16-LE, and the output of ``strings`` — with the
store's connections still open, as ``hybridmem serve`` keeps them.

* encryption off: after ``forget`` none of the forgotten namespace's markers is anywhere, while
  the kept namespace's are still found (so the search does see plaintext);
* a reader holding an open read transaction: the scrub is reported pending, and finishes once the
  reader ends (the service worker's idle retry, and the next open);
* encryption on: no marker of either namespace in any file, before and after ``forget``;
* damaged, moved or unsealed index files of an encrypted store: rebuilt from the store, with the
  search results of a fresh build;
* the same guarantee through the CLI and over HTTP.

The LLM is a real HTTP server answering like ``vllm serve`` (tests/fake_vllm_server.py): its
curation replies copy the turns into memories, and each answer carries a marker of its own, so
both go through the real LLM call cache beside the store.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridmem_local.cli.main import app
from hybridmem_local.config import Config, load_config
from hybridmem_local.files.sealing import MAGIC
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Session, Turn
from hybridmem_local.service.worker import CurationWorker
from hybridmem_local.storage.encryption import KEY_ENV, generate_master_key
from hybridmem_local.storage.paths import pending_marker
from hybridmem_local.storage.store import MemoryStore
from tests.factories import make_episode, make_tuple
from tests.fake_vllm_server import ChatServer, curation_reply
from tests.service.http_harness import live_service, session_body, wait_for_curation

GONE, KEPT = "gone", "kept"
#: Marker kinds that are stored (and so must be found for the kept namespace while encryption is
#: off); queries are only ever sent, never stored, so theirs must simply never be found.
STORED_KINDS = ("turn", "memory", "answer")


# --------------------------------------------------------------------------- markers and the search


@dataclass(frozen=True)
class Markers:
    """One namespace's unique strings, lowercase words ending in a digit: BM25 tokenizing and
    stemming leave them whole, so an index file would show them too."""

    namespace: str
    run: str

    def of(self, kind: str) -> str:
        return f"zq{kind}{self.namespace}{self.run}7"

    def all(self) -> dict[str, str]:
        return {kind: self.of(kind) for kind in (*STORED_KINDS, "query")}


def markers_for(namespace: str) -> Markers:
    return Markers(namespace, uuid.uuid4().hex[:10])


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def found(folder: Path, markers: dict[str, str]) -> dict[str, list[str]]:
    """kind → the files under ``folder`` holding that marker: in the raw bytes (any case), as
    UTF-16-LE, or in the printable strings ``strings`` finds (8-bit and 16-bit little-endian)."""
    hits: dict[str, list[str]] = {}
    for path in files_under(folder):
        raw = path.read_bytes().lower()
        printable = b"\n".join(
            subprocess.run(["strings", "-a", "-n", "6", *encoding, str(path)], capture_output=True, check=True).stdout
            for encoding in ([], ["-e", "l"])
        ).lower()
        for kind, marker in markers.items():
            needle = marker.encode()
            if needle in raw or marker.encode("utf-16-le") in raw or needle in printable:
                hits.setdefault(kind, []).append(str(path.relative_to(folder)))
    return hits


# --------------------------------------------------------------------------- an LLM and a store


def respond(body: dict, attempt: int) -> str:
    """Curation copies the turns into memories; an answer names the question's marker with
    ``answer`` in place of ``query``."""
    if body["response_format"]["json_schema"]["name"] == "AnswerDraft":
        text = " ".join(m["content"] for m in body["messages"])
        question = re.search(r"zqquery(\w+)", text)
        assert question, "the question reached the LLM"
        return json.dumps({"answer": f"It was zqanswer{question.group(1)}", "cited_memory_ids": ["E1"]})
    return curation_reply(body)


@pytest.fixture
def llm_server() -> Iterator[ChatServer]:
    server = ChatServer(respond)
    yield server
    server.stop()


def store_config(server: ChatServer, **extra) -> Config:
    """The store's config: the LLM server in constrained JSON, curation at once, no consolidation."""
    return load_config(
        None,
        server.overrides(
            **{
                "embedder.backend": "hashing",
                "answering.mode": "json",
                "llm.max_retries": 0,
                "curation.retry_rounds": 0,
                "consolidation.every_n_sessions": 0,
                "service.worker_poll_s": 0.1,
                "service.rate_limit_per_s": 1000.0,
                "service.rate_limit_burst": 1000,
                **extra,
            }
        ),
    )


def session_of(markers: Markers, index: int = 1) -> Session:
    turn = markers.of("turn")
    return Session(
        session_id=f"s{index}",
        namespace=markers.namespace,
        started_at=datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc),
        turns=[
            Turn(turn_id=f"s{index}:0", speaker="Alice", text=f"My locker code is {turn} and I told nobody."),
            Turn(turn_id=f"s{index}:1", speaker="Bob", text=f"Noted, {turn} stays between us."),
        ],
    )


def plant(memory: HybridMemory, markers: Markers, export_to: Path | None = None) -> None:
    """Every kind of marker of one namespace, through the facade: a curated session (turns, and
    memories copied from them), memories added directly, a search, an answer, an export."""
    namespace, memory_marker = markers.namespace, markers.of("memory")
    memory.add_session(session_of(markers))
    memory.add_memories(
        namespace,
        episodes=[make_episode(f"Trip {memory_marker}", f"We hiked to {memory_marker} in May.")],
        tuples=[make_tuple("Alice", "visited", f"the lake {memory_marker}")],
    )
    assert memory.search(f"where is {markers.of('query')}", namespace=namespace).memories()
    answer = memory.answer(f"what about {markers.of('query')}?", namespace=namespace)
    assert markers.of("answer") in answer.answer
    if export_to is not None:
        memory.export(namespace, export_to)


def assert_forgotten(folder: Path, gone: Markers, kept: Markers) -> None:
    """None of ``gone``'s markers anywhere under ``folder``; every stored marker of ``kept`` found."""
    assert found(folder, gone.all()) == {}
    kept_hits = found(folder, kept.all())
    assert set(STORED_KINDS) <= set(kept_hits), f"the search must see plaintext: {kept_hits}"


# --------------------------------------------------------------------------- encryption off


def test_forget_leaves_no_byte_of_the_namespace_with_the_store_open(tmp_path, hashing_embedder, llm_server):
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "memory.db"
    gone, kept = markers_for(GONE), markers_for(KEPT)
    config = store_config(llm_server)
    memory = HybridMemory.open(db, config, embedder=hashing_embedder)
    idle = MemoryStore.open(db, config.store)  # a second connection, as the service holds
    # A second facade, as the service's worker: it holds an index of the namespace with a change not saved yet.
    worker, worker_open = HybridMemory.open(db, config, embedder=hashing_embedder), True
    try:
        for markers in (gone, kept):
            plant(memory, markers, export_to=folder / f"{markers.namespace}.jsonl")
        memory.flush()
        worker.search("anything", namespace=GONE)
        worker.add_memories(GONE, episodes=[make_episode("Late", f"Late news of {gone.of('memory')}")])
        assert worker.search(gone.of("memory"), namespace=GONE).memories()
        before = found(folder, gone.all())
        # Planted where forget must reach: the db or its WAL, the index files, the LLM cache, the export.
        assert set(STORED_KINDS) <= set(before)
        assert any(p.startswith("memory.db.indexes/gone/") for p in before["memory"])
        assert "gone.jsonl" in before["turn"] and "memory.db.llm_cache.sqlite" in str(before["answer"])

        counts = memory.forget(GONE)

        assert counts["scrub_pending"] == 0 and counts["llm_cache"] >= 2 and counts["exports"] == 1
        assert not (folder / "memory.db.indexes" / GONE).exists() and not pending_marker(db).exists()
        assert_forgotten(folder, gone, kept)
        # The kept namespace is whole, and the store still works on both connections.
        assert kept.of("memory") in str(memory.search(kept.of("memory"), namespace=KEPT).memories())
        assert idle.counts(GONE)["turns"] == 0 and idle.counts(KEPT)["turns"] == 2
        # Indexes of the forgotten namespace still loaded elsewhere are not saved back.
        worker.close()
        worker_open = False
        assert found(folder, gone.all()) == {}
    finally:
        if worker_open:
            worker.close()
        idle.close()
        memory.close()
    assert found(folder, gone.all()) == {}


def test_purge_scrubs_the_store(tmp_path, hashing_embedder, llm_server):
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "memory.db"
    old, kept = markers_for("old"), markers_for(KEPT)
    with HybridMemory.open(db, store_config(llm_server), embedder=hashing_embedder) as memory:
        idle = MemoryStore.open(db, memory.config.store)
        [doomed] = memory.add_memories(KEPT, episodes=[make_episode("Old", f"An old note {old.of('memory')}")])
        memory.add_memories(KEPT, episodes=[make_episode("Kept", f"A kept note {kept.of('memory')}")])
        memory.delete(doomed)
        report = memory.purge(KEPT, older_than=timedelta(0))
        assert report.memories == 1 and not report.scrub_pending
        assert "memory" not in found(folder, old.all()) and "memory" in found(folder, kept.all())
        idle.close()


# --------------------------------------------------------------------------- a reader in the way


def open_reader(db: Path) -> sqlite3.Connection:
    """Another connection inside a read transaction that saw the rows before the forget."""
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM turns").fetchone()[0] > 0
    return reader


def plant_without_llm(memory: HybridMemory, markers: Markers) -> None:
    memory.enqueue([session_of(markers)])  # raw turns, curation left pending
    memory.add_memories(markers.namespace, episodes=[make_episode("Note", f"A note {markers.of('memory')}")])


@pytest.fixture
def blocked_forget(tmp_path, hashing_embedder, llm_server):
    """A store whose forget of GONE a reader held up: (memory, reader, folder, gone markers)."""
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "memory.db"
    gone, kept = markers_for(GONE), markers_for(KEPT)
    config = store_config(llm_server, **{"store.busy_timeout_ms": 300, "curation.mode": "queue"})
    memory = HybridMemory.open(db, config, embedder=hashing_embedder)
    for markers in (gone, kept):
        plant_without_llm(memory, markers)
    reader = open_reader(db)
    counts = memory.forget(GONE)
    assert counts["scrub_pending"] == 1, "a reader's open snapshot must not be reported scrubbed"
    assert pending_marker(db).exists()
    # What the pending report is about: the forgotten rows are still in the WAL.
    assert "-wal" in str(found(folder, gone.all()))
    yield memory, reader, folder, gone, kept
    reader.close()
    memory.close()


def test_a_reader_makes_the_scrub_pending_until_it_ends(blocked_forget):
    memory, reader, folder, gone, kept = blocked_forget
    assert memory.retry_pending_scrubs() == 1  # still reading: still pending, and no wait
    reader.execute("COMMIT")
    assert memory.retry_pending_scrubs() == 0
    assert found(folder, gone.all()) == {} and "memory" in found(folder, kept.all())
    assert not pending_marker(memory.store.path).exists()


def test_the_service_worker_finishes_a_pending_scrub_when_idle(blocked_forget, hashing_embedder, llm_server):
    memory, reader, folder, gone, _ = blocked_forget
    worker = CurationWorker(memory.store.path, memory.config, hashing_embedder, memory.llm)
    reader.execute("COMMIT")
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while pending_marker(memory.store.path).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pending_marker(memory.store.path).exists()
        assert found(folder, gone.all()) == {}
    finally:
        worker.close()


def test_the_next_open_finishes_a_pending_scrub(blocked_forget):
    memory, reader, folder, gone, _ = blocked_forget
    reader.execute("COMMIT")  # the reader stays connected: closing the last connection would checkpoint anyway
    reopened = MemoryStore.open(memory.store.path, memory.config.store)
    try:
        assert not pending_marker(memory.store.path).exists()
        assert found(folder, gone.all()) == {}
    finally:
        reopened.close()


def test_a_reader_of_the_llm_cache_makes_its_scrub_pending(tmp_path, hashing_embedder, llm_server):
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "memory.db"
    gone, kept = markers_for(GONE), markers_for(KEPT)
    config = store_config(llm_server, **{"store.busy_timeout_ms": 300})
    with HybridMemory.open(db, config, embedder=hashing_embedder) as memory:
        for markers in (gone, kept):
            plant(memory, markers)
        cache = Path(str(db) + ".llm_cache.sqlite")
        reader = sqlite3.connect(cache, isolation_level=None)
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM llm_calls").fetchone()[0] > 0
            counts = memory.forget(GONE)
            assert counts["scrub_pending"] == 1 and counts["llm_cache"] >= 2
            assert pending_marker(cache).exists() and not pending_marker(db).exists()
            assert "answer" in found(folder, gone.all())  # the deleted replies wait in the cache's WAL
            assert memory.retry_pending_scrubs() == 1
            reader.execute("COMMIT")
            assert memory.retry_pending_scrubs() == 0
        finally:
            reader.close()
        assert not pending_marker(cache).exists()
        assert_forgotten(folder, gone, kept)


# --------------------------------------------------------------------------- encryption on


@pytest.fixture
def master_key(monkeypatch) -> bytes:
    key = generate_master_key()
    monkeypatch.setenv(KEY_ENV, key.hex())
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    return key


def test_an_encrypted_store_shows_no_marker_before_or_after_forget(tmp_path, hashing_embedder, llm_server, master_key):
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "memory.db"
    gone, kept = markers_for(GONE), markers_for(KEPT)
    config = store_config(llm_server, **{"store.encryption": "sqlcipher"})
    memory = HybridMemory.open(db, config, embedder=hashing_embedder)
    idle = MemoryStore.open(db, config.store)
    try:
        for markers in (gone, kept):
            plant(memory, markers, export_to=folder / f"{markers.namespace}.jsonl")
        memory.flush()
        names = {str(p.relative_to(folder)) for p in files_under(folder)}
        assert {"memory.db", "memory.db.keyid", "memory.db.llm_cache.sqlite", f"{GONE}.jsonl", f"{KEPT}.jsonl"} <= names
        assert (folder / f"{KEPT}.jsonl").read_bytes().startswith(MAGIC)  # exports are sealed too
        index_files = [p for p in files_under(folder / "memory.db.indexes") if not p.name.endswith(".json")]
        assert index_files and all(p.read_bytes().startswith(MAGIC) for p in index_files)
        assert found(folder, {**gone.all(), **{f"kept {k}": v for k, v in kept.all().items()}}) == {}

        assert memory.forget(GONE)["scrub_pending"] == 0
        assert not (folder / f"{GONE}.jsonl").exists()

        assert found(folder, {**gone.all(), **{f"kept {k}": v for k, v in kept.all().items()}}) == {}
    finally:
        idle.close()
        memory.close()
    # The sealed indexes load again (no rebuild) and still find the kept namespace's memories.
    with HybridMemory.open(db, config, embedder=hashing_embedder) as reopened:
        assert kept.of("memory") in str(reopened.search(kept.of("memory"), namespace=KEPT).memories())
        assert reopened.stats(KEPT).counts["turns"] == 2
    assert found(folder, gone.all()) == {}


# --------------------------------------------------------------------------- damaged index files


QUERIES = ["hiking the lake in May", "Alice's beagle", "marathon training", "a new flat on Oak Avenue"]


def fill_encrypted(db: Path, config: Config, embedder) -> None:
    with HybridMemory.open(db, config, embedder=embedder) as memory:
        for namespace in ("a", "b"):
            memory.add_memories(
                namespace,
                episodes=[make_episode(f"{namespace} note {i}", f"{QUERIES[i % 4]} number {i}") for i in range(25)],
                tuples=[make_tuple("Alice", "mentioned", f"{QUERIES[i % 4]} {i}") for i in range(25)],
            )
            for query in QUERIES:
                memory.search(query, namespace=namespace)  # builds and saves every index kind


def search_results(db: Path, config: Config, embedder) -> dict:
    with HybridMemory.open(db, config, embedder=embedder) as memory:
        return {
            (namespace, query): memory.search(query, namespace=namespace).model_dump(mode="json")
            for namespace in ("a", "b")
            for query in QUERIES
        }


def index_file(db: Path, namespace: str, pattern: str) -> Path:
    """The one index file of ``namespace`` whose name matches ``pattern`` (``GEN`` is the generation)."""
    regex = re.escape(pattern).replace("GEN", r"[0-9a-f]{12}")
    [path] = [p for p in (Path(str(db) + ".indexes") / namespace).iterdir() if re.fullmatch(regex, p.name)]
    return path


def truncate(db: Path) -> None:
    path = index_file(db, "a", "episode.GEN.hnsw")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_bit(db: Path) -> None:
    path = index_file(db, "a", "tuple.bm25.GEN.vocab.json")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def swap_namespaces(db: Path) -> None:
    """a's episode index (manifest and files) put in b's folder, and b's in a's."""
    a, b = (Path(str(db) + ".indexes") / ns for ns in ("a", "b"))
    staging = a.parent / "staging"
    staging.mkdir()
    for source, target in ((a, staging), (b, a), (staging, b)):
        for path in [p for p in source.iterdir() if p.name.startswith("episode.")]:
            path.rename(target / path.name)
    staging.rmdir()


def unsealed(db: Path) -> None:
    """The labels file replaced by the very labels it holds, in plaintext (an unencrypted store's file)."""
    import io

    import numpy as np

    from hybridmem_local.config import StoreConfig

    store = MemoryStore.open(db, StoreConfig(encryption="sqlcipher"))
    try:
        labels = np.array(sorted(store.memories.active_ids("a", "tuple")), dtype=np.int64)
    finally:
        store.close()
    buffer = io.BytesIO()
    np.save(buffer, labels)
    index_file(db, "a", "tuple.GEN.labels.npy").write_bytes(buffer.getvalue())


@pytest.mark.parametrize("damage", [truncate, flip_a_bit, swap_namespaces, unsealed])
def test_a_damaged_sealed_index_is_rebuilt_with_fresh_results(damage, tmp_path, hashing_embedder, master_key, caplog):
    db = tmp_path / "memory.db"
    config = load_config(None, {"embedder.backend": "hashing", "store.encryption": "sqlcipher"})
    fill_encrypted(db, config, hashing_embedder)
    damage(db)
    with caplog.at_level(logging.INFO, logger="hybridmem_local.indexes"):
        damaged = search_results(db, config, hashing_embedder)
    assert re.search(r"rebuilding .*unreadable \(SealError", caplog.text), caplog.text
    shutil.rmtree(str(db) + ".indexes")
    assert damaged == search_results(db, config, hashing_embedder)


def test_a_sealed_file_opens_only_as_the_file_it_was_written_as(tmp_path):
    from hybridmem_local.errors import SealError
    from hybridmem_local.files.paths import GenerationFiles

    key = generate_master_key()

    def files(namespace: str = "a", kind: str = "episode", key: bytes | None = key) -> GenerationFiles:
        return GenerationFiles(tmp_path / namespace, f"{kind}.json", f"{kind}.{{}}.", f"{kind}.{{}}.tmp", "gen", key)

    (tmp_path / "a").mkdir()
    files().write_bytes("0123456789ab", "vocab.json", b'["zqsecret7"]')
    written = files().path("0123456789ab", "vocab.json")
    assert written.read_bytes().startswith(MAGIC) and b"zqsecret7" not in written.read_bytes()
    assert oct(written.stat().st_mode & 0o777) == "0o600"
    assert files().read_bytes("0123456789ab", "vocab.json") == b'["zqsecret7"]'
    # Moved to another namespace, kind, generation or file name: each fails to open.
    for namespace, kind, generation, suffix in [
        ("b", "episode", "0123456789ab", "vocab.json"),
        ("a", "tuple", "0123456789ab", "vocab.json"),
        ("a", "episode", "ba9876543210", "vocab.json"),
        ("a", "episode", "0123456789ab", "labels.npy"),
    ]:
        target = files(namespace, kind).path(generation, suffix)
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(written, target)
        with pytest.raises(SealError):
            files(namespace, kind).read_bytes(generation, suffix)
    with pytest.raises(SealError):  # another key
        files(key=generate_master_key()).read_bytes("0123456789ab", "vocab.json")
    files(key=None).write_bytes("0123456789ab", "data.npy", b"plain")  # an unencrypted store's file
    assert files(key=None).path("0123456789ab", "data.npy").read_bytes() == b"plain"
    with pytest.raises(SealError):
        files().read_bytes("0123456789ab", "data.npy")


# --------------------------------------------------------------------------- CLI and HTTP


def test_forget_through_the_cli(tmp_path, hashing_embedder, llm_server, hashing_cli):
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "memory.db"
    gone, kept = markers_for(GONE), markers_for(KEPT)
    config = store_config(llm_server)
    with HybridMemory.open(db, config, embedder=hashing_embedder) as memory:
        for markers in (gone, kept):
            plant(memory, markers, export_to=folder / f"{markers.namespace}.jsonl")
    hashing_cli.write_text(
        "embedder:\n  backend: hashing\nllm:\n  backend: openai-server\n"
        f"  model: {config.llm.model}\n  base_url: {llm_server.base_url}\n",
        encoding="utf-8",
    )
    idle = MemoryStore.open(db, config.store)  # the store stays open elsewhere meanwhile
    try:
        result = CliRunner().invoke(app, ["forget", "-n", GONE, "--yes", "--json", "--db", str(db)])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["scrub_pending"] == 0
        assert_forgotten(folder, gone, kept)
    finally:
        idle.close()


def test_forget_over_http(tmp_path, hashing_embedder, llm_server):
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "memory.db"
    gone, kept = markers_for(GONE), markers_for(KEPT)
    overrides = llm_server.overrides(
        **{
            "answering.mode": "json",
            "llm.max_retries": 0,
            "curation.retry_rounds": 0,
            "consolidation.every_n_sessions": 0,
            "service.worker_poll_s": 0.1,
            "service.rate_limit_per_s": 1000.0,
            "service.rate_limit_burst": 1000,
        }
    )
    with live_service(db, hashing_embedder, None, **overrides) as service:
        admin = service.state.keys.create([GONE, KEPT], "admin")[1]
        with service.client(admin) as client:
            for markers in (gone, kept):
                ns = f"/v1/namespaces/{markers.namespace}"
                turn = markers.of("turn")
                accepted = client.post(f"{ns}/sessions", json=session_body("s1", [f"code {turn}", f"ok {turn}"]))
                assert accepted.status_code == 202, accepted.text
                assert wait_for_curation(client, accepted.json()["status_url"])["curation_status"] == "curated"
                added = client.post(
                    f"{ns}/memories",
                    json={
                        "episodes": [
                            {
                                "title": "Trip",
                                "summary": "Trip",
                                "details": markers.of("memory"),
                                "timestamp": "2023-05-09",
                            }
                        ]
                    },
                )
                assert added.status_code == 201, added.text
                assert client.post(f"{ns}/search", json={"query": markers.of("query")}).status_code == 200
                asked = client.post(f"{ns}/ask", json={"question": f"what is {markers.of('query')}?"})
                assert markers.of("answer") in asked.json()["answer"], asked.text
            forgotten = client.delete(f"/v1/namespaces/{GONE}")
            assert forgotten.status_code == 200 and forgotten.json()["removed"]["scrub_pending"] == 0
            # Every connection of the service is still open here.
            assert_forgotten(folder, gone, kept)
    assert found(folder, gone.all()) == {}


def test_markers_are_found_when_present(tmp_path):
    """The search itself: plain, upper case, UTF-16-LE."""
    markers = markers_for("x")
    (tmp_path / "plain").write_bytes(b"..." + markers.of("turn").upper().encode() + b"...")
    (tmp_path / "wide").write_bytes(markers.of("memory").encode("utf-16-le"))
    (tmp_path / "none").write_bytes(os.urandom(4096))
    assert found(tmp_path, markers.all()) == {"turn": ["plain"], "memory": ["wide"]}
