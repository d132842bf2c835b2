"""``HybridMemoryClient`` against a real ``hybridmem serve`` stack (uvicorn on 127.0.0.1): every
method returns what ``HybridMemory`` returns in-process for the same store, as the same pydantic
types, and the service's error answers come back as the library's exceptions.

The LLM is a real HTTP server answering like ``vllm serve`` with fixed replies
(tests/service/scripted_llm.py), so curation and answers are known in advance.
"""

from __future__ import annotations

import os
import time
from datetime import date, datetime, timezone

import pytest

import hybridmem_local.service.client as client_module
from hybridmem_local.errors import (
    AskTimeoutError,
    ConflictError,
    ForbiddenError,
    HybridMemError,
    InvalidInputError,
    NotFoundError,
    QueueFullError,
    RateLimitedError,
    UnauthorizedError,
)
from hybridmem_local.results import Answer, Event, SearchResult, SessionRecord
from hybridmem_local.schema import Episode, EpisodeDraft, RelationalTuple, Session, TupleDraft, Turn
from hybridmem_local.service.client import HybridMemoryClient
from tests.fake_vllm_server import ChatServer, Sleep
from tests.service.http_harness import live_service
from tests.service.scripted_llm import ANSWER, llm_settings, respond

QUESTION = "What is the name of Alice's puppy?"
STARTED_AT = datetime(2023, 5, 7, 10, 0, tzinfo=timezone.utc)
EPISODES = [
    EpisodeDraft(
        title="Biscuit",
        summary="Alice adopted a puppy",
        details="Alice adopted a beagle puppy named Biscuit.",
        timestamp="2023-05-05",
    ),
    EpisodeDraft(
        title="Riverside 10K",
        summary="Bob ran a race",
        details="Bob ran the Riverside 10K in 52 minutes.",
        timestamp="2023-05-07",
    ),
]
TUPLES = [
    TupleDraft(entity="Alice", relation="adopted", object="Biscuit the beagle", timestamp="2023-05-05"),
    TupleDraft(entity="Bob", relation="ran", object="the Riverside 10K", timestamp="2023-05-07"),
    TupleDraft(entity="Alice", relation="moved to", object="Oak Avenue", timestamp="2023-05-29", context="new flat"),
]


def session(session_id: str, namespace: str = "alice") -> Session:
    return Session(
        session_id=session_id,
        namespace=namespace,
        started_at=STARTED_AT,
        turns=[
            Turn(turn_id=f"{session_id}:0", speaker="Alice", text="We moved to a flat on Oak Avenue last week."),
            Turn(turn_id=f"{session_id}:1", speaker="Bob", text="Nice! Is there room for Biscuit to run around?"),
        ],
    )


@pytest.fixture(scope="module")
def chat_server():
    server = ChatServer(respond)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def service(tmp_path_factory, hashing_embedder, chat_server):
    with live_service(
        tmp_path_factory.mktemp("client") / "memory.db", hashing_embedder, None, **llm_settings(chat_server)
    ) as svc:
        yield svc


@pytest.fixture(scope="module")
def tokens(service):
    keys = service.state.keys
    return {
        "write": keys.create(["alice"], "write")[1],
        "read": keys.create(["alice"], "read")[1],
        "admin": keys.create(["alice", "carol"], "admin")[1],
    }


def wait_curated(client: HybridMemoryClient, namespace: str, session_id: str, timeout_s: float = 60) -> SessionRecord:
    deadline = time.monotonic() + timeout_s
    while (record := client.get_session(namespace, session_id)).curation_status == "pending":
        assert time.monotonic() < deadline, "the worker did not curate the session"
        time.sleep(0.1)
    return record


def test_every_method_returns_what_the_library_returns_in_process(service, tokens, tmp_path, monkeypatch):
    with HybridMemoryClient(service.url, api_key=tokens["write"]) as client:
        queued = client.add_session(session("c1"))
        assert isinstance(queued, SessionRecord) and queued.curation_status == "pending"
        assert queued.session == session("c1")
        curated = wait_curated(client, "alice", "c1")
        assert curated.curation_status == "curated" and curated.session == session("c1")

        ids = client.add_memories("alice", episodes=EPISODES, tuples=TUPLES)
        assert len(ids) == 5
        remote = {
            "search": client.search(QUESTION, namespace="alice", k=3),
            "get": [client.get(i, namespace="alice") for i in ids],
            "list": client.list("alice"),
            "page": client.list("alice", kind="tuple", limit=2, offset=1),
            "history": client.history(ids[0], namespace="alice"),
            "stats": client.stats("alice"),
        }
        # Two memories a page: `list` without a limit walks every page.
        monkeypatch.setattr(client_module, "PAGE_SIZE", 2)
        remote["paged"] = client.list("alice", status=None)
        answer = client.answer(QUESTION, namespace="alice", question_date=STARTED_AT)

    with service.state.memory() as memory:  # the server's own HybridMemory, asked directly
        local = {
            "search": memory.search(QUESTION, namespace="alice", k=3),
            "get": [memory.get(i) for i in ids],
            "list": memory.list("alice"),
            "page": memory.list("alice", kind="tuple", limit=2, offset=1),
            "history": memory.history(ids[0]),
            "stats": memory.stats("alice"),
            "paged": memory.list("alice", status=None),
        }
    assert isinstance(remote["search"], SearchResult) and remote["search"] == local["search"]
    assert remote["search"].episodes[0].memory.id == ids[0]
    assert all(isinstance(m, (Episode, RelationalTuple)) for m in remote["list"])
    for name in ("get", "list", "page", "history", "paged"):
        assert remote[name] == local[name], name
    assert len(remote["list"]) == 5 + 3 and len(remote["page"]) == 2 and len(remote["paged"]) == 8
    assert all(isinstance(e, Event) for e in remote["history"])
    assert remote["stats"].counts == local["stats"].counts and remote["stats"].namespaces == ["alice"]
    assert isinstance(answer, Answer) and answer.answer == ANSWER and [m.id for m in answer.cited] == [ids[0]]


def test_delete_and_export_match_the_store(service, tokens, tmp_path):
    with HybridMemoryClient(service.url, api_key=tokens["write"]) as client:
        [memory_id] = client.add_memories(
            "alice", tuples=[TupleDraft(entity="Bob", relation="likes", object="tea", timestamp="2023-06-01")]
        )
        assert client.delete(memory_id, namespace="alice") is None
        deleted = client.get(memory_id, namespace="alice")
        assert deleted.status == "deleted"
        assert [e.action for e in client.history(memory_id, namespace="alice")][-1] == "deleted"
        assert memory_id not in [m.id for m in client.list("alice")]
        lines = client.export("alice", tmp_path / "alice.jsonl")
    with service.state.memory() as memory:
        expected = memory.export_records("alice")
    assert lines == len(expected) and (tmp_path / "alice.jsonl").read_text() == "".join(expected)
    assert os.stat(tmp_path / "alice.jsonl").st_mode & 0o777 == 0o600


def test_enqueue_search_filters_and_namespaced_ids_work_as_in_process(service, tokens):
    lima = TupleDraft(entity="Alice", relation="visited", object="Lima", timestamp="2021-03-01")
    filters = {"kinds": ["tuple"], "since": date(2021, 1, 1), "until": date(2021, 12, 31)}
    with HybridMemoryClient(service.url, api_key=tokens["write"]) as client:
        records = client.enqueue([session("e1"), session("e2")])
        assert [(r.session, r.curation_status) for r in records] == [
            (session("e1"), "pending"),
            (session("e2"), "pending"),
        ]
        assert wait_curated(client, "alice", "e2").curation_status == "curated"
        [lima_id] = client.add_memories("alice", tuples=[lima])
        remote = client.search("Where did Alice travel?", namespace="alice", **filters)
    with service.state.memory() as memory:
        local = memory.search("Where did Alice travel?", namespace="alice", **filters)
    assert remote == local and [hit.memory.id for hit in remote.tuples] == [lima_id] and remote.episodes == []

    with HybridMemoryClient(service.url, api_key=tokens["write"]) as client:
        client.delete(lima_id, "wrong city", namespace="alice")
        assert client.history(lima_id, namespace="alice")[-1].reason == "wrong city"
        # In-process None means any namespace; the service scopes ids, so it must be named.
        for call in (client.get, client.history, client.delete):
            with pytest.raises(InvalidInputError, match="pass namespace"):
                call(lima_id)


def test_errors_come_back_as_the_library_exceptions(service, tokens, tmp_path):
    with HybridMemoryClient(service.url, api_key=tokens["write"]) as client:
        with pytest.raises(NotFoundError) as missing:
            client.get(10**12, namespace="alice")
        assert isinstance(missing.value, HybridMemError) and (missing.value.code, missing.value.status) == (
            "not_found",
            404,
        )
        with pytest.raises(ValueError) as invalid:
            client.search(QUESTION, namespace="alice", k=0)
        assert invalid.value.code == "validation_error" and invalid.value.status == 422 and "k" in invalid.value.message
        with pytest.raises(ValueError, match="invalid namespace"):  # refused before any request, as in-process
            client.search(QUESTION, namespace="../carol")
        client.add_session(session("dup"))
        with pytest.raises(ConflictError) as duplicate:
            client.add_session(session("dup"))
        assert (duplicate.value.code, duplicate.value.status) == ("conflict", 409)
        with pytest.raises(ForbiddenError) as other:
            client.search(QUESTION, namespace="carol")
        assert (other.value.code, other.value.status) == ("forbidden", 403) and "carol" in other.value.message
        with pytest.raises(ForbiddenError) as not_admin:
            client.forget("alice")
        assert not_admin.value.code == "forbidden"

    with HybridMemoryClient(service.url, api_key=tokens["read"]) as reader:
        with pytest.raises(ForbiddenError) as read_only:
            reader.add_memories("alice", episodes=EPISODES[:1])
        assert read_only.value.code == "forbidden" and "write" in read_only.value.message

    for token in (None, "hm_00000000_" + "x" * 43):
        with HybridMemoryClient(service.url, api_key=token) as stranger:
            with pytest.raises(UnauthorizedError) as refused:
                stranger.stats("alice")
            assert (refused.value.code, refused.value.status) == ("unauthorized", 401)

    with HybridMemoryClient(service.url, api_key=tokens["admin"]) as admin:
        with pytest.raises(NotFoundError):
            admin.undo(10**9, namespace="alice")
        admin.add_memories("carol", tuples=TUPLES[:1])
        removed = admin.forget("carol")
        assert removed["memories"] == 1
        with pytest.raises(NotFoundError):
            admin.export("carol", tmp_path / "carol.jsonl")
        assert not (tmp_path / "carol.jsonl").exists()


def test_a_full_queue_a_rate_limit_and_a_slow_answer_raise_their_own_errors(tmp_path, hashing_embedder):
    slow = ChatServer(lambda body, attempt: Sleep(3.0, respond(body, attempt)))
    settings = llm_settings(
        slow,
        **{
            "service.max_pending_sessions": 1,
            "service.rate_limit_per_s": 0.01,
            "service.rate_limit_burst": 3,
            "service.ask_timeout_s": 0.5,
        },
    )
    try:
        with live_service(tmp_path / "memory.db", hashing_embedder, None, start_worker=False, **settings) as svc:
            _, writer = svc.state.keys.create(["alice"], "write")
            _, searcher = svc.state.keys.create(["alice"], "read")
            _, asker = svc.state.keys.create(["alice"], "read")
            with HybridMemoryClient(svc.url, api_key=writer) as client:
                client.add_session(session("q1"))
                with pytest.raises(QueueFullError) as full:
                    client.add_session(session("q2"))
                assert (full.value.code, full.value.status) == ("queue_full", 503)
            with HybridMemoryClient(svc.url, api_key=searcher) as client:
                for _ in range(3):
                    client.search(QUESTION, namespace="alice")
                with pytest.raises(RateLimitedError) as limited:
                    client.search(QUESTION, namespace="alice")
                assert (limited.value.code, limited.value.status) == ("rate_limited", 429)
                assert limited.value.retry_after is not None and limited.value.retry_after >= 1
            with HybridMemoryClient(svc.url, api_key=asker) as client:
                with pytest.raises(AskTimeoutError) as late:
                    client.answer(QUESTION, namespace="alice")
                assert (late.value.code, late.value.status) == ("timeout", 504)
    finally:
        slow.stop()
