"""The service's process state and curation worker: batches across namespaces, failures,
consolidation on schedule, stop/restart, the bounded queue and the ask timeout.

The LLM is the openai-server backend (official client, call cache, retries) against a real HTTP
server on 127.0.0.1 answering like ``vllm serve`` (tests/fake_vllm_server.py): the local models
cannot curate within a test's time on these cores (tests/faults/test_crash.py says why), and a
server shows what the worker sends, and when.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hybridmem_local.config import Config, load_config
from hybridmem_local.errors import AskTimeoutError, DuplicateSessionError, QueueFullError
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Session
from hybridmem_local.service.state import ServiceState
from tests.fake_vllm_server import Barrier, ChatServer, Sleep, Status, curation_reply, session_key
from tests.faults.corpus import curated_sessions

TURNS = 3
#: curation_reply writes one episode per window and one tuple per turn; a session is one window.
MEMORIES_PER_SESSION = 1 + TURNS


def sessions_of(*namespaces: str, each: int = 2, first: int = 1) -> list[Session]:
    return [c.session for ns in namespaces for c in curated_sessions(ns, each, seed=9, first=first, turns=TURNS)]


def answer_or_curate(curate: Callable[[dict], object]) -> Callable[[dict, int], object]:
    """A responder: curation requests (their system prompt asks for source_turn_ids) get
    ``curate(body)``, questions an answer."""

    def respond(body: dict, attempt: int):
        if "source_turn_ids" in body["messages"][0]["content"]:
            return curate(body)
        return json.dumps({"answer": "Oslo", "cited_memory_ids": []})

    return respond


def config_for(server: ChatServer, **extra) -> Config:
    return load_config(
        None,
        server.overrides(
            **{
                "answering.mode": "json",
                "llm.max_retries": 0,
                "curation.retry_rounds": 0,
                "consolidation.every_n_sessions": 0,
                "service.worker_poll_s": 0.1,
                **extra,
            }
        ),
    )


def wait_until(condition: Callable[[], bool], timeout_s: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def finished(state: ServiceState, sessions: int) -> bool:
    """The queue is empty and the worker has counted ``sessions`` curated or failed: its last batch
    is over (a batch's last status commit empties the queue before the batch's counters move)."""
    status = state.worker.status()
    return status.pending == 0 and status.sessions_curated + status.sessions_failed == sessions


def session_rows(db: Path) -> dict[tuple[str, str], tuple[str, str | None, int]]:
    """(namespace, session id) → (curation status, error, memories citing the session), read apart."""
    conn = sqlite3.connect(db)
    try:
        return {
            (ns, sid): (
                status,
                error,
                conn.execute(
                    "SELECT count(*) FROM memories WHERE namespace = ? AND source_session_id = ?", (ns, sid)
                ).fetchone()[0],
            )
            for ns, sid, status, error in conn.execute(
                "SELECT namespace, session_id, curation_status, curation_error FROM sessions"
            )
        }
    finally:
        conn.close()


@pytest.fixture
def chat_server():
    server = ChatServer(answer_or_curate(curation_reply))
    yield server
    server.stop()


# --------------------------------------------------------------------------- batching


@pytest.mark.parametrize("batch_sessions", [6, 3])
def test_one_batched_llm_call_curates_sessions_of_several_namespaces(tmp_path, hashing_embedder, batch_sessions):
    # The server holds every request until `batch_sessions` of them are in flight at once: a
    # batch sent one request at a time would break the barrier and fail its sessions.
    server = ChatServer(answer_or_curate(lambda body: Barrier(curation_reply(body))), barrier_parties=batch_sessions)
    # Session numbers tell the namespaces apart on the wire: alice s1-2, bob s11-12, carol s21-22.
    sessions = sessions_of("alice") + sessions_of("bob", first=11) + sessions_of("carol", first=21)
    try:
        with ServiceState(
            tmp_path / "m.db",
            config_for(server, **{"curation.batch_sessions": batch_sessions}),
            embedder=hashing_embedder,
        ) as state:
            state.enqueue(sessions)
            wait_until(lambda: finished(state, len(sessions)), what="the queue to drain")
            status = state.worker.status()
    finally:
        server.stop()
    assert status.batches == len(sessions) // batch_sessions
    assert (status.sessions_curated, status.sessions_failed, status.memories) == (6, 0, 6 * MEMORIES_PER_SESSION)
    # Oldest first across namespaces: each batch is the next `batch_sessions` sessions in arrival order.
    sent = [session_key(body) for body in server.requests]
    batches = [set(sent[i : i + batch_sessions]) for i in range(0, len(sent), batch_sessions)]
    arrival = [s.session_id for s in sessions]
    assert batches == [set(arrival[i : i + batch_sessions]) for i in range(0, len(arrival), batch_sessions)]
    rows = session_rows(tmp_path / "m.db")
    assert {key: (s, n) for key, (s, _, n) in rows.items()} == {
        (s.namespace, s.session_id): ("curated", MEMORIES_PER_SESSION) for s in sessions
    }


def test_failed_sessions_become_curation_failed_and_the_worker_goes_on(tmp_path, hashing_embedder):
    # bob's sessions (s11, s12) get HTTP 400 for their windows (never retried); the others a good reply.
    server = ChatServer(
        answer_or_curate(lambda body: Status(400) if session_key(body) in ("s11", "s12") else curation_reply(body))
    )
    first = sessions_of("alice") + sessions_of("bob", first=11)
    later = sessions_of("carol", each=1)
    try:
        with ServiceState(
            tmp_path / "m.db", config_for(server, **{"curation.batch_sessions": 4}), embedder=hashing_embedder
        ) as state:
            state.enqueue(first)
            wait_until(lambda: finished(state, len(first)), what="the first sessions")
            state.enqueue(later)
            wait_until(lambda: finished(state, len(first) + len(later)), what="the later session")
            status = state.worker.status()
            assert state.ready
    finally:
        server.stop()
    rows = session_rows(tmp_path / "m.db")
    for s in first + later:
        curation_status, error, memories = rows[(s.namespace, s.session_id)]
        if s.namespace == "bob":
            assert curation_status == "curation_failed" and "HTTP 400" in error and memories == 0
        else:
            assert (curation_status, error, memories) == ("curated", None, MEMORIES_PER_SESSION)
    assert (status.sessions_curated, status.sessions_failed, status.batches) == (3, 2, 2)


def test_scheduled_consolidation_runs_for_the_namespaces_that_are_due(tmp_path, hashing_embedder, chat_server):
    config = config_for(chat_server, **{"consolidation.every_n_sessions": 2, "curation.batch_sessions": 8})
    with ServiceState(tmp_path / "m.db", config, embedder=hashing_embedder) as state:
        state.enqueue(sessions_of("alice", each=2) + sessions_of("bob", each=1))
        wait_until(lambda: state.worker.status().batches == 1, what="the batch")
        status = state.worker.status()
    assert status.consolidation_runs == 1
    conn = sqlite3.connect(tmp_path / "m.db")
    try:
        runs = conn.execute("SELECT namespace, finished_at IS NOT NULL FROM consolidation_runs").fetchall()
        counters = dict(conn.execute("SELECT name, sessions_since_consolidation FROM namespaces"))
    finally:
        conn.close()
    # alice's 2 sessions made her due (a run over too few memories to cluster, recorded all the same).
    assert runs == [("alice", 1)]
    assert counters == {"alice": 0, "bob": 1}


# --------------------------------------------------------------------------- stop and restart


def test_a_batch_abandoned_in_the_llm_is_never_written_and_a_restart_curates_it_once(tmp_path, hashing_embedder):
    llm_s = 2.0
    server = ChatServer(answer_or_curate(lambda body: Sleep(llm_s, curation_reply(body))))
    db = tmp_path / "m.db"
    sessions = sessions_of("alice", "bob", each=1)
    try:
        config = config_for(server, **{"curation.batch_sessions": 4})
        state = ServiceState(db, config, embedder=hashing_embedder)
        state.open()
        state.enqueue(sessions)
        wait_until(lambda: len(server.requests) == len(sessions), what="the batch to reach the LLM")
        assert state.worker.stop(wait_s=0.1) is False, "the batch is still inside the LLM"
        state.close()
        time.sleep(llm_s + 1)  # the abandoned call has returned by now
        assert {s for s, _, _ in session_rows(db).values()} == {"pending"}
        assert all(n == 0 for _, _, n in session_rows(db).values())

        with ServiceState(db, config, embedder=hashing_embedder) as state:
            wait_until(lambda: state.worker.status().pending == 0, what="the restart to curate")
            # The abandoned call's replies were kept by the call cache: nothing is asked twice.
            assert len(server.requests) == len(sessions)
            # A batch that finishes within stop's wait is written, not abandoned.
            state.enqueue(sessions_of("carol", each=1))
            wait_until(lambda: len(server.requests) == len(sessions) + 1, what="carol's batch")
            assert state.worker.stop(wait_s=30) is True
    finally:
        server.stop()
    rows = session_rows(db)
    assert len(rows) == 3 and all(v == ("curated", None, MEMORIES_PER_SESSION) for v in rows.values()), rows


def test_a_session_curated_meanwhile_is_skipped_not_stored_twice(tmp_path, hashing_embedder, chat_server):
    config = config_for(chat_server)
    [session] = sessions_of("alice", each=1)
    with (
        HybridMemory.open(tmp_path / "m.db", config, embedder=hashing_embedder) as first,
        HybridMemory.open(tmp_path / "m.db", config, embedder=hashing_embedder) as second,
    ):
        first.store.sessions.insert(session, curation_status="pending")
        # Both curators read the session while it was pending; the first one stores it.
        assert first.curate_stored([session]).curated == 1
        report = second.curate_stored([session])
    assert (report.curated, report.skipped) == (0, 1)
    assert session_rows(tmp_path / "m.db")[("alice", session.session_id)] == ("curated", None, MEMORIES_PER_SESSION)


# --------------------------------------------------------------------------- queue and ask


def test_enqueue_stores_all_or_nothing(tmp_path, hashing_embedder, chat_server):
    config = config_for(chat_server, **{"service.max_pending_sessions": 4})
    with ServiceState(tmp_path / "m.db", config, embedder=hashing_embedder, start_worker=False) as state:
        records = state.enqueue(sessions_of("alice", each=2))
        assert [r.curation_status for r in records] == ["pending", "pending"]
        with pytest.raises(QueueFullError, match="max_pending_sessions=4"):
            state.enqueue(sessions_of("bob", each=3))
        # A batch with one session already stored: none of it is stored.
        with pytest.raises(DuplicateSessionError):
            state.enqueue(sessions_of("bob", each=1) + sessions_of("alice", each=1))
        assert state.worker.status().pending == 2
        assert state.ready
    assert set(session_rows(tmp_path / "m.db")) == {("alice", "s1"), ("alice", "s2")}


def test_ask_times_out_while_curation_holds_the_llm_then_answers(tmp_path, hashing_embedder):
    curation_s, timeout_s = 8.0, 2.0
    server = ChatServer(answer_or_curate(lambda body: Sleep(curation_s, curation_reply(body))))
    try:
        config = config_for(server, **{"service.ask_timeout_s": timeout_s})
        with ServiceState(tmp_path / "m.db", config, embedder=hashing_embedder) as state:
            state.enqueue(sessions_of("alice", each=1))
            wait_until(lambda: len(server.requests) == 1, what="curation to reach the LLM")
            started = time.monotonic()
            with pytest.raises(AskTimeoutError):
                state.answer("Where did Ann go?", "alice", None, None)
            waited = time.monotonic() - started
            assert timeout_s <= waited < curation_s - 2, (
                f"waited {waited:.1f}s: the timeout must not wait for the batch"
            )
            wait_until(lambda: state.worker.status().pending == 0, what="curation")
            state.config.service.ask_timeout_s = 60  # once the LLM is free, a question gets its answer
            answer = state.answer("Where did Ann go?", "alice", None, None)
    finally:
        server.stop()
    assert answer.answer == "Oslo"
