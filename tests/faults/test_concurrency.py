"""Several processes on one store (WAL + busy timeout): no error reaches the user, no write is lost.

Writers are forked from the zygote (tests/faults/writer.py) and run at the same time; the test
process reads (searches) all along.
"""

from __future__ import annotations

import json
import time

import pytest

from hybridmem_local.memory import HybridMemory
from tests.faults.corpus import QUERIES, curated_sessions, write_jsonl
from tests.faults.invariants import (
    assert_consistent,
    assert_integrity,
    assert_search_matches_rebuild,
    session_states,
)
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


@pytest.mark.slow
def test_two_writers_and_a_reader_on_one_store_lose_nothing(zygote, minilm, tmp_path):
    db = tmp_path / "m.db"
    HybridMemory.open(db).close()
    # Both writers write to both namespaces (so to the same index files), sessions disjoint.
    batches = [
        [c for i in range(5) for ns in ("alice", "bob") for c in curated_sessions(ns, 1, seed=w, first=1 + 10 * w + i)]
        for w in range(2)
    ]
    # Saving often makes the two writers' index saves overlap, as busy processes' saves would.
    specs = [
        job(
            "add_sessions",
            db,
            write_jsonl(batch, tmp_path / f"w{w}.jsonl"),
            tmp_path,
            f"writer{w}",
            saves_per_session=5,
        )
        for w, batch in enumerate(batches)
    ]
    zygote.start(specs)
    try:
        searches = _read_until_done(db, minilm, specs, ["alice", "bob"])
    finally:
        codes = zygote.wait()
    assert searches > 0
    errors = [e for e in (error_text(spec) for spec in specs) if e]
    assert not errors, errors[0]

    assert_integrity(db)
    states = session_states(db, batches[0] + batches[1])
    for spec in specs:
        committed = {tuple(line.split()[1:]) for line in progress_lines(spec) if line.startswith("committed")}
        assert all(states[key] == "present" for key in committed), "a committed write was lost"
    assert_consistent(db, zygote.model_id)
    assert_search_matches_rebuild(db, minilm, ["alice", "bob"], tmp_path)
    assert list(codes.values()) == [0, 0]
    assert set(states.values()) == {"present"}, "a write was lost"
    with HybridMemory.open(db, embedder=minilm) as memory:
        assert memory.store.counts()["sessions"] == 20
        assert len(memory.list("alice")) == len(memory.list("bob")) == 10 * 6


@pytest.mark.slow
def test_two_processes_ingesting_the_same_file_store_each_session_once(zygote, tmp_path):
    db = tmp_path / "m.db"
    HybridMemory.open(db).close()
    sessions = [c.session for c in curated_sessions("alice", 300, seed=5, turns=2)]
    sessions_file = write_jsonl(sessions, tmp_path / "sessions.jsonl")
    specs = [job("ingest", db, sessions_file, tmp_path, f"ingest{w}", curate=False) for w in range(2)]
    zygote.start(specs)
    codes = zygote.wait()
    assert [error_text(s) for s in specs] == ["", ""]
    assert list(codes.values()) == [0, 0]
    reports = [json.loads(progress_lines(s)[0].removeprefix("report ")) for s in specs]
    # Every session is stored by exactly one of the two; the other counts it as skipped.
    assert sum(r["stored"] for r in reports) == 300 and all(r["stored"] + r["skipped"] == 300 for r in reports)
    assert_integrity(db)
    with HybridMemory.open(db) as memory:
        counts = memory.store.counts("alice")
        assert (counts["sessions"], counts["turns"]) == (300, 600)
        for record in memory.store.sessions.select("alice"):
            assert len(record.session.turns) == 2
