"""Many HTTP clients at once against one service: adding sessions (curated by the worker in the
background), adding memories and searching, for a bounded time. No request fails, no write is
lost, and afterwards the service's search results equal those of a freshly opened HybridMemory
on the same file.

The curation LLM is the openai-server backend against a local server answering like
``vllm serve`` (tests/fake_vllm_server.py), so curation commits land while clients search.
"""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from hybridmem_local.config import load_config
from hybridmem_local.memory import HybridMemory
from hybridmem_local.service.app import create_app
from hybridmem_local.service.state import ServiceState
from tests.fake_vllm_server import ChatServer, Sleep, curation_reply
from tests.faults.corpus import QUERIES, curated_sessions
from tests.service.live import ThreadedServer

CLIENTS = 6
DURATION_S = 4.0
NAMESPACES = ("alice", "bob")
TURNS = 3
MEMORIES_PER_SESSION = 1 + TURNS  # curation_reply: one episode per window, one tuple per turn


def client_loop(index: int, base_url: str, deadline: float, writes: dict, errors: list) -> None:
    rng = random.Random(index)
    n = 0
    with httpx.Client(base_url=base_url, timeout=60) as client:
        while time.monotonic() < deadline:
            namespace = rng.choice(NAMESPACES)
            n += 1
            choice = rng.random()
            try:
                if choice < 0.7:
                    response = client.post(
                        f"/v1/namespaces/{namespace}/search", json={"query": rng.choice(QUERIES), "k": 5}
                    )
                    writes["searches"] += 1
                elif choice < 0.85:
                    sid = f"c{index}-{n}"
                    body = {
                        "session_id": sid,
                        "started_at": "2023-05-08T13:56:00+00:00",
                        "turns": [
                            {
                                "turn_id": f"{sid}:{i}",
                                "speaker": "Ann",
                                "text": f"Client {index} bought a kayak in Oslo, note {n}.{i}.",
                            }
                            for i in range(TURNS)
                        ],
                    }
                    response = client.post(f"/v1/namespaces/{namespace}/sessions", json=body)
                    if response.status_code == 202:
                        writes["sessions"].append((namespace, sid))
                else:
                    title = f"client {index} note {n}"
                    body = {
                        "episodes": [
                            {
                                "title": title,
                                "summary": f"Client {index} painted a quilt in Lima.",
                                "details": f"Note {n} of client {index}.",
                                "timestamp": "2023-05-08",
                            }
                        ]
                    }
                    response = client.post(f"/v1/namespaces/{namespace}/memories", json=body)
                    if response.status_code == 201:
                        writes["memories"].append((namespace, response.json()["ids"][0], title))
                if response.status_code >= 300:
                    errors.append(
                        f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text}"
                    )
            except httpx.HTTPError as exc:
                errors.append(f"client {index}: {exc!r}")


def result_ids(result: dict) -> tuple[list[int], list[int]]:
    return [h["memory"]["id"] for h in result["episodes"]], [h["memory"]["id"] for h in result["tuples"]]


@pytest.mark.slow
def test_clients_adding_and_searching_at_once_lose_nothing_and_match_a_fresh_open(tmp_path, minilm):
    llm = ChatServer(lambda body, attempt: Sleep(0.05, curation_reply(body)))
    db = tmp_path / "m.db"
    config = load_config(
        None,
        llm.overrides(
            **{
                "llm.max_retries": 0,
                "curation.retry_rounds": 0,
                "curation.batch_sessions": 4,
                "consolidation.every_n_sessions": 0,
                "service.worker_poll_s": 0.1,
                # Not a rate-limit test (test_http_routes.py has those): six clients searching as fast
                # as incremental BM25 allows pass the default 20 requests/s.
                "service.rate_limit_per_s": 10_000,
                "service.rate_limit_burst": 10_000,
            }
        ),
    )
    writes: dict = {"sessions": [], "memories": [], "searches": 0}
    errors: list[str] = []
    try:
        with ServiceState(db, config, embedder=minilm) as state:
            with state.memory() as memory:
                for ns in NAMESPACES:
                    for item in curated_sessions(ns, 3, seed=12):
                        memory.add_memories(ns, episodes=item.episodes, tuples=item.tuples, session=item.session)
            with ThreadedServer(create_app(state, require_auth=False)) as server:
                deadline = time.monotonic() + DURATION_S
                threads = [
                    threading.Thread(target=client_loop, args=(i, server.base_url, deadline, writes, errors))
                    for i in range(CLIENTS)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(120)
                assert not errors, errors[:5]
                assert writes["sessions"] and writes["memories"] and writes["searches"] >= CLIENTS, writes
                print(
                    f"{writes['searches']} searches, {len(writes['sessions'])} sessions, {len(writes['memories'])} "
                    "memories added"
                )
                wait_deadline = time.monotonic() + 120
                while state.worker.status().pending:
                    assert time.monotonic() < wait_deadline, "the worker did not drain the queue"
                    time.sleep(0.1)
                assert state.worker.status().sessions_failed == 0
                with httpx.Client(base_url=server.base_url, timeout=60) as client:
                    served = {
                        (ns, q): result_ids(
                            client.post(f"/v1/namespaces/{ns}/search", json={"query": q, "k": 5}).json()
                        )
                        for ns in NAMESPACES
                        for q in QUERIES
                    }
    finally:
        llm.stop()

    with HybridMemory.open(db, config, embedder=minilm) as fresh:
        for ns, sid in writes["sessions"]:
            record = fresh.store.sessions.get(ns, sid)
            assert record.curation_status == "curated" and len(record.session.turns) == TURNS
            assert (
                fresh.store.scalar(
                    "SELECT count(*) FROM memories WHERE namespace = :namespace AND source_session_id = :session_id",
                    {"namespace": ns, "session_id": sid},
                )
                == MEMORIES_PER_SESSION
            )
        for ns, memory_id, title in writes["memories"]:
            stored = fresh.get(memory_id)
            assert (stored.namespace, stored.title) == (ns, title)
        for (ns, query), ids in served.items():
            result = fresh.search(query, namespace=ns, k=5)
            assert ids == ([h.memory.id for h in result.episodes], [h.memory.id for h in result.tuples]), (ns, query)
