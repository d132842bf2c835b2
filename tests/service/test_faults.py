"""SIGKILL of ``hybridmem serve`` while sessions are queued and while a curation batch is running.

The server is a real subprocess on 127.0.0.1; sessions go in over HTTP. After each kill the
database passes ``PRAGMA integrity_check``, and every session that got its 202 is stored with
all its turns, either still pending (no memories) or curated with exactly its memories; after
the last restart every one is curated once: none lost, none curated twice.

The curation LLM is the openai-server backend against a local server answering like
``vllm serve`` (tests/fake_vllm_server.py), slowed down so that kills land inside a batch.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.fake_vllm_server import ChatServer, Sleep, curation_reply
from tests.faults.corpus import curated_sessions
from tests.faults.invariants import assert_integrity
from tests.service.live import ServeProcess

TURNS = 3
MEMORIES_PER_SESSION = 1 + TURNS  # curation_reply: one episode per window, one tuple per turn
LLM_S = 1.5

OVERRIDES = {
    "llm.max_retries": 0,
    "curation.retry_rounds": 0,
    "curation.batch_sessions": 3,
    "consolidation.every_n_sessions": 0,
    "service.worker_poll_s": 0.2,
}


def session_body(session) -> dict:
    return {
        "session_id": session.session_id,
        "started_at": session.started_at.isoformat(),
        "turns": [t.model_dump(exclude_none=True) for t in session.turns],
    }


def stored(db: Path) -> dict[tuple[str, str], tuple[str, int, int, int]]:
    """(namespace, session id) → (status, turns, memories, distinct memory contents), read apart."""
    conn = sqlite3.connect(db)
    try:
        out = {}
        for pk, ns, sid, status in conn.execute("SELECT id, namespace, session_id, curation_status FROM sessions"):
            turns = conn.execute("SELECT count(*) FROM turns WHERE session_pk = ?", (pk,)).fetchone()[0]
            memories, distinct = conn.execute(
                "SELECT count(*), count(DISTINCT kind || coalesce(title, '') || coalesce(entity, '') || "
                "coalesce(object, '') || source_turn_ids) FROM memories WHERE namespace = ? AND source_session_id = ?",
                (ns, sid),
            ).fetchone()
            out[(ns, sid)] = (status, turns, memories, distinct)
        return out
    finally:
        conn.close()


def assert_accepted_are_whole(db: Path, accepted: set[tuple[str, str]]) -> dict[str, int]:
    """Every accepted session is stored whole, pending without memories or curated with exactly
    its own; returns how many are in each status."""
    assert_integrity(db)
    rows = stored(db)
    assert set(rows) == accepted, f"lost: {accepted - set(rows)}, unexpected: {set(rows) - accepted}"
    counts = {"pending": 0, "curated": 0}
    for key, (status, turns, memories, distinct) in rows.items():
        assert turns == TURNS, f"{key}: {turns} turns"
        assert (status, memories) in (("pending", 0), ("curated", MEMORIES_PER_SESSION)), (
            f"{key}: {status}, {memories} memories"
        )
        assert distinct == memories, f"{key}: a memory is stored twice"
        counts[status] += 1
    return counts


def wait_until(condition, timeout_s: float, what: str, server: ServeProcess | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            worker = httpx.get(f"{server.base_url}/readyz", timeout=10).text if server else ""
            raise AssertionError(f"timed out waiting for {what}; worker: {worker}")
        time.sleep(0.1)


@pytest.mark.slow
def test_sigkill_while_queued_and_mid_batch_loses_nothing_and_curates_each_session_once(tmp_path):
    llm = ChatServer(lambda body, attempt: Sleep(LLM_S, curation_reply(body)))
    db = tmp_path / "m.db"
    overrides = llm.overrides(**OVERRIDES)
    sessions = [c.session for ns in ("alice", "bob", "carol") for c in curated_sessions(ns, 4, seed=11, turns=TURNS)]
    accepted: set[tuple[str, str]] = set()
    servers: list[ServeProcess] = []

    def start(n: int) -> ServeProcess:
        servers.append(ServeProcess(db, overrides, tmp_path / f"serve{n}.log"))
        servers[-1].wait_ready()
        return servers[-1]

    try:
        # 1. Sessions go in; kill while most are queued and the first batch is inside the LLM.
        server = start(1)
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            for session in sessions:
                response = client.post(f"/v1/namespaces/{session.namespace}/sessions", json=session_body(session))
                assert response.status_code == 202, response.text
                assert response.json()["curation_status"] == "pending"
                accepted.add((session.namespace, session.session_id))
        wait_until(lambda: len(llm.requests) >= 1, 30, "the first batch to reach the LLM")
        server.kill()
        first = assert_accepted_are_whole(db, accepted)
        assert first["pending"] >= len(sessions) - OVERRIDES["curation.batch_sessions"], first

        # 2. Restart; kill again once a batch is committed and the next one is inside the LLM.
        server = start(2)
        wait_until(
            lambda: assert_accepted_are_whole(db, accepted)["curated"] > first["curated"],
            60,
            "a batch to commit",
            server,
        )
        sent = len(llm.requests)
        wait_until(lambda: len(llm.requests) > sent, 30, "the next batch to reach the LLM")
        server.kill()
        second = assert_accepted_are_whole(db, accepted)
        assert 0 < second["pending"] < len(sessions), second

        # 3. Restart and let it finish: every accepted session curated exactly once.
        server = start(3)
        wait_until(lambda: assert_accepted_are_whole(db, accepted)["pending"] == 0, 120, "the queue to drain")
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            for ns, sid in sorted(accepted):
                assert client.get(f"/v1/namespaces/{ns}/sessions/{sid}").json()["curation_status"] == "curated"
            readiness = client.get("/readyz").json()
        assert readiness["worker"]["pending"] == 0
        # uvicorn ends a SIGTERM'd server gracefully, then re-raises the signal: -SIGTERM is a clean end too.
        assert server.terminate() in (0, -signal.SIGTERM), server.log_path.read_text()[-3000:]
    finally:
        llm.stop()
        for left in servers:
            if left.process.poll() is None:
                left.kill()
    final = assert_accepted_are_whole(db, accepted)
    assert final == {"pending": 0, "curated": len(sessions)}
