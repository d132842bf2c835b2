"""Several processes on one store (WAL + busy timeout): no error reaches the user, no write is lost.

Writers are forked from the zygote (tests/faults/writer.py) and run at the same time; the test
process reads (searches) all along.
"""

from __future__ import annotations

import time

import pytest

from hybridmem_local.memory import HybridMemory
from tests.faults.corpus import QUERIES, curated_sessions, write_jsonl
from tests.faults.invariants import assert_consistent, assert_integrity, check_repair, session_states
from tests.faults.writer import error_text, job, progress_lines


def _read_until_done(db, minilm, specs, namespaces, timeout_s=240) -> int:
    """Search ``db`` until every writer reports done; every hit must be an active memory."""
    searches = 0
    deadline = time.monotonic() + timeout_s
    with HybridMemory.open(db, embedder=minilm) as reader:
        while not all("done" in progress_lines(s) or error_text(s) for s in specs):
            assert time.monotonic() < deadline, [progress_lines(s)[-1:] for s in specs]
            namespace = namespaces[searches % len(namespaces)]
            result = reader.search(QUERIES[searches % len(QUERIES)], namespace=namespace)
            for hit in result.episodes + result.tuples:
                assert hit.memory.status == "active" and hit.memory.namespace == namespace
            searches += 1
    return searches


#: ``VectorIndex.save`` writes fixed temporary names (``<kind>.manifest.json.tmp``...): when two
#: processes save the same index at once, one renames the other's temporaries away and its
#: ``chmod``/``os.replace`` raises FileNotFoundError — an error that reaches the user on
#: ``flush``/``close``. Fix in index.py: unique temporary names per save (and see TORN_GRAPH_BUG).
INDEX_SAVE_RACE = "index.py: two processes saving one index collide on its temporary file names"


def _known_save_race(error: str) -> bool:
    return "FileNotFoundError" in error and ".tmp" in error and "index.py" in error and "save" in error


@pytest.mark.slow
def test_two_writers_and_a_reader_on_one_store_lose_nothing(zygote, minilm, tmp_path):
    db = tmp_path / "m.db"
    HybridMemory.open(db).close()
    # Both writers write to both namespaces (so to the same index files), sessions disjoint.
    batches = [
        [c for i in range(5) for ns in ("alice", "bob") for c in curated_sessions(ns, 1, seed=w, first=1 + 10 * w + i)]
        for w in range(2)
    ]
    specs = [job("add_sessions", db, write_jsonl(batch, tmp_path / f"w{w}.jsonl"), tmp_path, f"writer{w}")
             for w, batch in enumerate(batches)]
    zygote.start(specs)
    searches = _read_until_done(db, minilm, specs, ["alice", "bob"])
    codes = zygote.wait()
    assert searches > 0
    errors = [error_text(spec) for spec in specs]
    unexpected = [e for e in errors if e and not _known_save_race(e)]
    assert not unexpected, unexpected[0]

    assert_integrity(db)
    states = session_states(db, batches[0] + batches[1])
    for spec in specs:
        committed = {tuple(line.split()[1:]) for line in progress_lines(spec) if line.startswith("committed")}
        assert all(states[key] == "present" for key in committed), "a committed write was lost"
    assert_consistent(db, zygote.model_id)
    repaired = check_repair(db, minilm, ["alice", "bob"], tmp_path)
    if any(errors):
        pytest.xfail(INDEX_SAVE_RACE)
    assert list(codes.values()) == [0, 0]
    assert set(states.values()) == {"present"}, "a write was lost"
    with HybridMemory.open(db, embedder=minilm) as memory:
        assert memory.store.counts()["sessions"] == 20
        assert len(memory.list("alice")) == len(memory.list("bob")) == 10 * 6
    if not repaired:
        pytest.xfail("index files saved by two processes interleaved (see TORN_GRAPH_BUG in test_crash.py)")


#: ``ingest`` filters sessions already stored, then inserts the rest one transaction each; a
#: second process storing the same session in between makes ``insert_session`` raise
#: StoreError("already exists") instead of skipping it. Fix in memory.py: treat a session that
#: appeared meanwhile as skipped (check inside the insert's transaction, or catch that error).
INGEST_OVERLAP_RACE = "memory.py: two ingests of the same file race between has_session and insert_session"


@pytest.mark.slow
def test_two_processes_ingesting_the_same_file_store_each_session_once(zygote, tmp_path):
    db = tmp_path / "m.db"
    HybridMemory.open(db).close()
    sessions = [c.session for c in curated_sessions("alice", 300, seed=5, turns=2)]
    sessions_file = write_jsonl(sessions, tmp_path / "sessions.jsonl")
    specs = [job("ingest", db, sessions_file, tmp_path, f"ingest{w}", curate=False) for w in range(2)]
    zygote.start(specs)
    codes = zygote.wait()
    errors = [error_text(s) for s in specs]
    unexpected = [e for e in errors if e and "already exists in namespace 'alice'" not in e]
    assert not unexpected, unexpected[0]
    assert_integrity(db)
    with HybridMemory.open(db) as memory:
        counts = memory.store.counts("alice")
        for record in memory.store.iter_sessions("alice"):
            assert len(record.session.turns) == 2
    if 0 in codes.values():  # a writer that finished stored every session
        assert (counts["sessions"], counts["turns"]) == (300, 600)
    if any(errors):
        pytest.xfail(INGEST_OVERLAP_RACE)
    assert list(codes.values()) == [0, 0]
    assert (counts["sessions"], counts["turns"]) == (300, 600)
