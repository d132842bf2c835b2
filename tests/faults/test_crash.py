"""SIGKILL of a writer at random moments of ingest and curation; torn index saves.

After every kill the database passes ``PRAGMA integrity_check``, every session is whole or
wholly absent (session row ⇔ its turns ⇔ its memories and their cached vectors), nothing is
half-consolidated, and opening the store repairs its index files: search equals a fresh
rebuild. Killing *consolidation apply* is covered in ``tests/test_consolidation.py``
(``test_sigkill_during_apply_leaves_the_store_before_or_after_never_between``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from hybridmem_local.memory import HybridMemory
from tests.faults.corpus import curated_sessions, write_jsonl
from tests.faults.invariants import (
    assert_consistent,
    assert_integrity,
    assert_search_matches_rebuild,
    check_repair,
    connect,
    session_states,
)
from tests.faults.llm_server import ChatServer, Sleep, curation_reply, session_key
from tests.faults.writer import error_text, job, progress_lines

NAMESPACES = ("alice", "bob")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it finished first: also a valid outcome
        pass


def _copy_store(source: Path, target: Path) -> Path:
    shutil.copy(source, target)
    indexes = Path(str(source) + ".indexes")
    if indexes.exists():
        shutil.copytree(indexes, Path(str(target) + ".indexes"))
    return target


def _wait_for_lines(spec: dict, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while len(progress_lines(spec)) < n:
        assert time.monotonic() < deadline, f"writer stalled: {progress_lines(spec)} {error_text(spec)}"
        time.sleep(0.005)


# --------------------------------------------------------------------------- ingest (store + embed + index)


@pytest.fixture(scope="module")
def ingest_corpus(tmp_path_factory, minilm):
    """A store holding 2 sessions per namespace, and 12 more sessions for writers to add."""
    root = tmp_path_factory.mktemp("kill_ingest")
    initial = [c for ns in NAMESPACES for c in curated_sessions(ns, 2, seed=1)]
    later = [c for i in range(6) for ns in NAMESPACES for c in curated_sessions(ns, 1, seed=2, first=3 + i)]
    pristine = root / "pristine.db"
    with HybridMemory.open(pristine, embedder=minilm) as memory:
        for item in initial:
            memory.add_memories(item.session.namespace, episodes=item.episodes, tuples=item.tuples, session=item.session)
        for ns in NAMESPACES:
            memory.search("load and save the indexes", namespace=ns)
    return pristine, initial, later, write_jsonl(later, root / "later.jsonl")


@pytest.mark.slow
def test_sigkill_during_ingest_leaves_whole_sessions_and_self_repairing_indexes(zygote, minilm, ingest_corpus, tmp_path):
    pristine, initial, later, sessions_file = ingest_corpus
    expected = initial + later
    reference_s = 0.0  # how long the unkilled writer (seed 0) runs
    outcomes = []
    torn = []
    for seed in range(20):
        rng = random.Random(seed)
        work = tmp_path / f"seed{seed}"
        work.mkdir()
        db = _copy_store(pristine, work / "m.db")
        spec = job("add_sessions", db, sessions_file, work, "writer")
        started = time.perf_counter()
        [pid] = zygote.start([spec])
        if seed == 0:
            mode = "not killed"
        elif seed % 2:
            # Right after a random commit, plus a random slice of the next session's work.
            commits = rng.randrange(len(later))
            _wait_for_lines(spec, commits)
            time.sleep(rng.uniform(0, 2 * reference_s / len(later)))
            _kill(pid)
            mode = f"after {commits} commits"
        else:
            time.sleep(rng.uniform(0, reference_s))
            _kill(pid)
            mode = "random delay"
        [code] = zygote.wait().values()
        if seed == 0:
            reference_s = time.perf_counter() - started
            assert code == 0, error_text(spec)
        assert code in (0, -signal.SIGKILL), f"seed {seed}: writer exited {code}: {error_text(spec)}"
        assert not error_text(spec), error_text(spec)

        assert_integrity(db)
        states = session_states(db, expected)
        committed = {tuple(line.split()[1:]) for line in progress_lines(spec) if line.startswith("committed")}
        written = [states[(c.session.namespace, c.session.session_id)] for c in later]
        assert all(states[(c.session.namespace, c.session.session_id)] == "present" for c in initial)
        assert all(states[key] == "present" for key in committed), f"seed {seed}: a reported commit was lost"
        # One writer writes in order: the present sessions are a prefix, at most one beyond the last report.
        n_present = written.count("present")
        assert written == ["present"] * n_present + ["absent"] * (len(later) - n_present), written
        assert len(committed) <= n_present <= len(committed) + 1
        assert_consistent(db, zygote.model_id)
        if not check_repair(db, minilm, NAMESPACES, work):
            torn.append(seed)
        outcomes.append((mode, n_present))
        shutil.rmtree(work)
    assert outcomes[0] == ("not killed", len(later))
    assert len({n for _, n in outcomes[1:]}) >= 4, f"kills landed in too few places: {outcomes}"
    if torn:
        pytest.xfail(f"seeds {torn}: killed between the renames of an index save (see TORN_GRAPH_BUG)")


# --------------------------------------------------------------------------- torn index saves


def _index_files(db: Path, namespace: str) -> dict[str, bytes]:
    folder = Path(str(db) + ".indexes") / namespace
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith("tuple.") and p.is_file()}


#: The new graph beside the old labels and manifest loads as a valid index whose live set
#: disagrees with its graph: ``sync`` then unmarks labels that are not deleted (or marks deleted
#: ones again) and hnswlib raises. Fix in index.py: make the three files one unit (e.g. name the
#: graph and labels after a save token that the manifest, renamed last, records).
TORN_GRAPH_BUG = pytest.mark.xfail(strict=True, raises=RuntimeError,
                                   reason="index.py: a torn save (new graph, old labels) breaks the next open")


@pytest.mark.parametrize("change", ["add", "delete", "add_and_delete"])
@pytest.mark.parametrize("replaced", [pytest.param(("graph",), marks=TORN_GRAPH_BUG, id="graph"),
                                      pytest.param(("graph", "labels"), id="graph+labels")])
def test_a_kill_between_the_renames_of_an_index_save_is_repaired_on_open(tmp_path, minilm, change, replaced):
    """``VectorIndex.save`` renames graph, labels, manifest in turn: a kill between two renames
    leaves new files beside old ones. The next open must still search like a fresh rebuild."""
    items = curated_sessions("alice", 4, seed=3)
    db = tmp_path / "m.db"
    with HybridMemory.open(db, embedder=minilm) as memory:
        for item in items[:3]:
            memory.add_memories("alice", episodes=item.episodes, tuples=item.tuples, session=item.session)
        memory.search("save the indexes", namespace="alice")
    old = _index_files(db, "alice")
    with HybridMemory.open(db, embedder=minilm) as memory:
        memory.search("load the indexes", namespace="alice")
        if change in ("add", "add_and_delete"):
            item = items[3]
            memory.add_memories("alice", episodes=item.episodes, tuples=item.tuples, session=item.session)
        if change in ("delete", "add_and_delete"):
            for m in memory.list("alice", kind="tuple")[:3]:
                memory.delete(m.id)
    new = _index_files(db, "alice")
    assert old != new
    names = {"graph": "tuple.hnsw", "labels": "tuple.labels.npy", "manifest": "tuple.manifest.json"}
    folder = Path(str(db) + ".indexes") / "alice"
    for part, name in names.items():
        (folder / name).write_bytes(new[name] if part in replaced else old[name])
    assert_search_matches_rebuild(db, minilm, ["alice"], tmp_path)


# --------------------------------------------------------------------------- curation (LLM + store)
#
# The LLM is the openai-server backend (official client, call cache, retries) against a local
# HTTP server answering like vLLM: llama.cpp's SmolLM2 crashes in this environment and the
# tiny random transformers model never finishes a JSON reply within its token budget.

CURATION_OVERRIDES = {
    # One request per session, no retries: each session commits on its own, runs are predictable.
    "llm.max_retries": 0,
    "curation.retry_rounds": 0,
    "curation.batch_sessions": 1,
    "consolidation.every_n_sessions": 0,
}


def _curation_responder(body: dict, attempt: int):
    # Session s2's window always gets a reply cut off mid-JSON: it must end as curation_failed.
    if session_key(body) == "s2":
        return Sleep(0.3, '{"episodes": [{"title": "Cut')
    return Sleep(0.3, curation_reply(body))


def _curation_state(db: Path) -> dict:
    """Per session: status, turns, and the memories' content (no ids or wall-clock times)."""
    conn = connect(db)
    try:
        out = {}
        for s in conn.execute("SELECT id, session_id, curation_status FROM sessions ORDER BY session_id"):
            turns = conn.execute("SELECT count(*) FROM turns WHERE session_pk = ?", (s["id"],)).fetchone()[0]
            memories = [
                tuple(r) for r in conn.execute(
                    "SELECT kind, title, summary, details, entity, relation, object, context, timestamp, source_turn_ids "
                    "FROM memories WHERE source_session_id = ? ORDER BY id", (s["session_id"],))
            ]
            out[s["session_id"]] = (s["curation_status"], turns, memories)
        return out
    finally:
        conn.close()


@pytest.mark.slow
def test_sigkill_during_curation_then_rerun_ends_exactly_as_an_uninterrupted_ingest(zygote, minilm, tmp_path):
    server = ChatServer(_curation_responder, key=session_key)
    try:
        sessions = [c.session for c in curated_sessions("carol", 4, seed=4, turns=4)]
        sessions_file = write_jsonl(sessions, tmp_path / "sessions.jsonl")
        overrides = server.overrides(**CURATION_OVERRIDES)

        reference_spec = job("ingest", tmp_path / "reference.db", sessions_file, tmp_path, "reference", overrides=overrides)
        started = time.perf_counter()
        zygote.start([reference_spec])
        assert list(zygote.wait().values()) == [0], error_text(reference_spec)
        duration = time.perf_counter() - started
        report = json.loads(progress_lines(reference_spec)[0].removeprefix("report "))
        assert (report["stored"], report["curated"], report["failed"]) == (4, 3, 1)
        reference = _curation_state(tmp_path / "reference.db")
        assert [status for status, _, _ in reference.values()] == ["curated", "curation_failed", "curated", "curated"]
        assert all(turns == 4 for _, turns, _ in reference.values())
        assert [len(memories) for _, _, memories in reference.values()] == [5, 0, 5, 5]

        outcomes = []
        for seed in range(1, 7):
            rng = random.Random(seed)
            db = tmp_path / f"kill{seed}.db"
            spec = job("ingest", db, sessions_file, tmp_path, f"kill{seed}", overrides=overrides)
            [pid] = zygote.start([spec])
            time.sleep(rng.uniform(0.2, 1.0) * duration)
            _kill(pid)
            [code] = zygote.wait().values()
            assert code in (0, -signal.SIGKILL) and not error_text(spec), error_text(spec)
            assert_integrity(db)
            cache = Path(str(db) + ".llm_cache.sqlite")
            if cache.exists():
                conn = sqlite3.connect(cache)
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                conn.close()
            killed = _curation_state(db)
            for sid, state in killed.items():
                assert state == reference[sid], f"seed {seed}: session {sid} is stored differently after the kill"
            assert_consistent(db, zygote.model_id)

            resume = job("ingest", db, sessions_file, tmp_path, f"resume{seed}", overrides=overrides)
            zygote.start([resume])
            assert list(zygote.wait().values()) == [0], error_text(resume)
            assert _curation_state(db) == reference
            resumed = json.loads(progress_lines(resume)[0].removeprefix("report "))
            assert resumed["skipped"] == len(killed)
            outcomes.append(len(killed))
        assert len(set(outcomes)) >= 2, f"kills landed in too few places: {outcomes}"
        assert check_repair(db, minilm, ["carol"], tmp_path)
    finally:
        server.stop()
