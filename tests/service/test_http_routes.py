"""Every route of the HTTP API through httpx against uvicorn on 127.0.0.1 (no mocks of the app).

The curation worker and ``ask`` run on the tiny random-weight transformers model
(tests/tiny_model.py): its answers are noise, but the request path, the queue and the
response models are the real ones. SmolLM2 answers in the one ``slow`` test.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from openapi_spec_validator import validate

from hybridmem_local.results import (
    Answer,
    ConsolidationReport,
    Event,
    SearchResult,
    SessionRecord,
    Stats,
    UndoReport,
)
from hybridmem_local.schema import Episode, RelationalTuple
from hybridmem_local.service.keys import ApiKey
from tests.service.http_harness import live_service, session_body, wait_for_curation
from tests.tiny_model import tiny_transformers_llm

FAST = {"service.rate_limit_per_s": 1000.0, "service.rate_limit_burst": 1000}

EPISODES = [
    {
        "title": "Biscuit",
        "summary": "Alice adopted a puppy",
        "details": "Alice adopted a beagle puppy named Biscuit.",
        "timestamp": "2023-05-05",
    },
    {
        "title": "Riverside 10K",
        "summary": "Bob ran a race",
        "details": "Bob ran the Riverside 10K in 52 minutes.",
        "timestamp": "2023-05-07",
    },
]
TUPLES = [
    {"entity": "Alice", "relation": "adopted", "object": "Biscuit the beagle", "timestamp": "2023-05-05"},
    {"entity": "Bob", "relation": "ran", "object": "the Riverside 10K", "timestamp": "2023-05-07"},
    {
        "entity": "Alice",
        "relation": "moved to",
        "object": "Oak Avenue",
        "timestamp": "2023-05-29",
        "context": "new flat",
    },
]


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory):
    return tiny_transformers_llm(tmp_path_factory.mktemp("tiny-llama"), max_new_tokens=64)


@pytest.fixture(scope="module")
def service(tmp_path_factory, hashing_embedder, tiny_llm):
    with live_service(tmp_path_factory.mktemp("routes") / "memory.db", hashing_embedder, tiny_llm, **FAST) as svc:
        yield svc


@pytest.fixture(scope="module")
def tokens(service):
    keys = service.state.keys
    return {
        "read": keys.create(["alice"], "read")[1],
        "write": keys.create(["alice"], "write")[1],
        "admin": keys.create(["alice", "carol"], "admin")[1],
        "bob": keys.create(["bob"], "write")[1],
    }


@pytest.fixture(scope="module")
def memory_ids(service, tokens):
    with service.client(tokens["write"]) as client:
        response = client.post("/v1/namespaces/alice/memories", json={"episodes": EPISODES, "tuples": TUPLES})
    assert response.status_code == 201, response.text
    return response.json()["ids"]


def test_health_and_readiness_need_no_key(service):
    with service.client() as client:
        health = client.get("/healthz")
        ready = client.get("/readyz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert ready.status_code == 200 and ready.json()["ready"] is True


def test_a_session_is_stored_at_once_and_curated_by_the_worker(service, tokens):
    body = session_body("s1", ["I adopted a beagle puppy called Biscuit!", "Congratulations, Alice!"])
    with service.client(tokens["write"]) as client:
        started = time.perf_counter()
        response = client.post("/v1/namespaces/alice/sessions", json=body)
        answered_in = time.perf_counter() - started
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert accepted == {
            "namespace": "alice",
            "session_id": "s1",
            "curation_status": "pending",
            "status_url": "/v1/namespaces/alice/sessions/s1",
        }
        record = SessionRecord.model_validate(wait_for_curation(client, accepted["status_url"]))
    # The raw turns are stored as sent, and the worker reached a verdict (the tiny model may fail).
    assert [t.text for t in record.session.turns] == [t["text"] for t in body["turns"]]
    assert record.curation_status in {"curated", "curation_failed"}
    assert answered_in < 5, "adding a session must not wait for curation"


def test_a_batch_is_stored_all_or_nothing(service, tokens):
    with service.client(tokens["write"]) as client:
        ok = client.post(
            "/v1/namespaces/alice/sessions/batch",
            json={"sessions": [session_body("b1", ["one"]), session_body("b2", ["two"])]},
        )
        assert ok.status_code == 202, ok.text
        assert [a["session_id"] for a in ok.json()] == ["b1", "b2"]
        clash = client.post(
            "/v1/namespaces/alice/sessions/batch",
            json={"sessions": [session_body("b3", ["three"]), session_body("b1", ["again"], prefix="x")]},
        )
        assert clash.status_code == 409 and clash.json()["error"]["code"] == "conflict"
        assert "b1" in clash.json()["error"]["message"]
        assert client.get("/v1/namespaces/alice/sessions/b3").status_code == 404  # b3 was not kept either


def test_memories_get_list_in_pages_delete_and_history(service, tokens, memory_ids):
    with service.client(tokens["write"]) as client:
        first = Episode.model_validate(client.get(f"/v1/namespaces/alice/memories/{memory_ids[0]}").json())
        assert first.details == EPISODES[0]["details"] and first.namespace == "alice"
        third = RelationalTuple.model_validate(client.get(f"/v1/namespaces/alice/memories/{memory_ids[2]}").json())
        assert third.object == "Biscuit the beagle"

        seen, offset = [], 0
        while offset is not None:
            page = client.get("/v1/namespaces/alice/memories", params={"limit": 2, "offset": offset}).json()
            assert len(page["items"]) <= 2
            seen += [item["id"] for item in page["items"]]
            offset = page["next_offset"]
        assert seen == sorted(seen) and set(memory_ids) <= set(seen)
        tuples = client.get("/v1/namespaces/alice/memories", params={"kind": "tuple", "limit": 1000}).json()["items"]
        assert {t["kind"] for t in tuples} == {"tuple"}

        victim = memory_ids[1]
        deleted = client.delete(f"/v1/namespaces/alice/memories/{victim}")
        assert deleted.status_code == 200 and deleted.json()["status"] == "deleted"
        active = [m["id"] for m in client.get("/v1/namespaces/alice/memories", params={"limit": 1000}).json()["items"]]
        every = [
            m["id"]
            for m in client.get("/v1/namespaces/alice/memories", params={"limit": 1000, "status": "any"}).json()[
                "items"
            ]
        ]
        assert victim not in active and victim in every
        history = [
            Event.model_validate(e) for e in client.get(f"/v1/namespaces/alice/memories/{victim}/history").json()
        ]
        assert [e.action for e in history] == ["add", "deleted"]


def test_search_finds_what_was_added(service, tokens, memory_ids):
    with service.client(tokens["read"]) as client:
        response = client.post(
            "/v1/namespaces/alice/search", json={"query": "What is the name of Alice's puppy?", "k": 1}
        )
    assert response.status_code == 200, response.text
    result = SearchResult.model_validate(response.json())
    assert result.episodes[0].memory.id == memory_ids[0]
    assert len(result.episodes) == 1 and len(result.tuples) <= 2


def test_ask_answers_from_the_namespace_with_an_llm(service, tokens, memory_ids):
    with service.client(tokens["read"]) as client:
        response = client.post(
            "/v1/namespaces/alice/ask",
            json={"question": "What is the puppy called?", "question_date": "2023-06-01T09:00:00Z", "k": 2},
        )
    assert response.status_code == 200, response.text
    answer = Answer.model_validate(response.json())
    assert answer.question == "What is the puppy called?"
    assert "Biscuit" in answer.context_text  # the retrieved memories were put in front of the model


def test_export_streams_the_namespace_as_jsonl(service, tokens, memory_ids):
    with service.client(tokens["read"]) as client:
        response = client.get("/v1/namespaces/alice/export")
        counts = client.get("/v1/namespaces/alice/stats").json()["counts"]
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    records = [json.loads(line) for line in response.text.splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds == sorted(kinds, key=lambda t: t != "session")  # sessions first, then memories
    assert kinds.count("session") == counts["sessions"]
    assert {r["id"] for r in records if r["type"] == "memory"} >= set(memory_ids)


def test_stats_and_reads_reveal_nothing_of_other_namespaces(service, tokens, memory_ids):
    with service.client(tokens["bob"]) as bob:
        bob_id = bob.post("/v1/namespaces/bob/memories", json={"tuples": [TUPLES[1]]}).json()["ids"][0]
    with service.client(tokens["read"]) as client:
        stats = Stats.model_validate(client.get("/v1/namespaces/alice/stats").json())
        assert stats.namespaces == ["alice"] and all(k.startswith("alice/") for k in stats.index_sizes)
        foreign = client.get(f"/v1/namespaces/alice/memories/{bob_id}")
        missing = client.get("/v1/namespaces/alice/memories/999999")
        assert foreign.status_code == missing.status_code == 404
        assert client.get(f"/v1/namespaces/alice/memories/{bob_id}/history").status_code == 404
    with service.client(tokens["write"]) as client:
        assert client.delete(f"/v1/namespaces/alice/memories/{bob_id}").status_code == 404
    with service.state.memory() as memory:
        assert memory.get(bob_id).status.value == "active"


def test_consolidate_dry_run_then_a_run_and_its_undo(service, tokens, memory_ids):
    with service.client(tokens["admin"]) as client:
        dry = client.post("/v1/namespaces/alice/consolidate", json={"dry_run": True})
        assert dry.status_code == 200, dry.text
        assert ConsolidationReport.model_validate(dry.json()).dry_run is True
        run = ConsolidationReport.model_validate(client.post("/v1/namespaces/alice/consolidate", json={}).json())
        assert run.run_id is not None
        undone = client.post(f"/v1/namespaces/alice/consolidation-runs/{run.run_id}/undo")
        assert undone.status_code == 200, undone.text
        UndoReport.model_validate(undone.json())
        again = client.post(f"/v1/namespaces/alice/consolidation-runs/{run.run_id}/undo")
        assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
        # A run of a namespace this key also reaches, asked for under another: not found.
        elsewhere = client.post(f"/v1/namespaces/carol/consolidation-runs/{run.run_id}/undo")
        assert elsewhere.status_code == 404


def test_forget_removes_the_namespace(service, tokens):
    with service.client(tokens["admin"]) as client:
        client.post("/v1/namespaces/carol/memories", json={"episodes": [EPISODES[1]]}).raise_for_status()
        assert client.get("/v1/namespaces/carol/stats").json()["namespaces"] == ["carol"]
        forgotten = client.delete("/v1/namespaces/carol")
        assert forgotten.status_code == 200 and forgotten.json()["removed"]["memories"] == 1
        after = client.get("/v1/namespaces/carol/stats").json()
        assert after["namespaces"] == [] and after["counts"]["sessions"] == 0
        assert client.get("/v1/namespaces/carol/export").status_code == 404


def test_keys_routes_create_list_and_revoke_within_the_admins_namespaces(service, tokens):
    with service.client(tokens["admin"]) as admin:
        created = admin.post("/v1/keys", json={"namespaces": ["alice"], "role": "read", "label": "reader"})
        assert created.status_code == 201, created.text
        key, token = ApiKey.model_validate(created.json()["key"]), created.json()["token"]
        with service.client(token) as reader:
            assert reader.get("/v1/namespaces/alice/stats").status_code == 200
            listed = [ApiKey.model_validate(k) for k in admin.get("/v1/keys").json()]
            assert key.key_id in {k.key_id for k in listed}
            assert all(set(k.namespaces) <= {"alice", "carol"} for k in listed)  # never bob's key
            for outside in (["bob"], ["*"], ["alice", "bob"]):
                refused = admin.post("/v1/keys", json={"namespaces": outside, "role": "read"})
                assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
            bob_key = next(k for k in service.state.keys.list() if k.namespaces == ["bob"])
            assert admin.delete(f"/v1/keys/{bob_key.key_id}").status_code == 404
            revoked = admin.delete(f"/v1/keys/{key.key_id}")
            assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
            after = reader.get("/v1/namespaces/alice/stats")
            assert after.status_code == 401 and after.json()["error"]["code"] == "unauthorized"


def test_openapi_schema_is_valid_and_lists_every_route(service):
    with service.client() as client:
        schema = client.get("/openapi.json").json()
    validate(schema)  # openapi-spec-validator: raises on any violation of the OpenAPI 3.1 spec
    routes = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}
    ns = "/v1/namespaces/{namespace}"
    assert routes >= {
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("POST", f"{ns}/sessions"),
        ("POST", f"{ns}/sessions/batch"),
        ("GET", f"{ns}/sessions/{{session_id}}"),
        ("POST", f"{ns}/messages"),
        ("POST", f"{ns}/memories"),
        ("GET", f"{ns}/memories"),
        ("GET", f"{ns}/memories/{{memory_id}}"),
        ("DELETE", f"{ns}/memories/{{memory_id}}"),
        ("GET", f"{ns}/memories/{{memory_id}}/history"),
        ("POST", f"{ns}/search"),
        ("POST", f"{ns}/ask"),
        ("GET", f"{ns}/export"),
        ("GET", f"{ns}/stats"),
        ("DELETE", ns),
        ("POST", f"{ns}/consolidate"),
        ("POST", f"{ns}/consolidation-runs/{{run_id}}/undo"),
        ("GET", f"{ns}/redactions"),
        ("POST", f"{ns}/redactions/{{redaction_id}}/undo"),
        ("POST", f"{ns}/redactions/{{redaction_id}}/confirm"),
        ("GET", "/v1/keys"),
        ("POST", "/v1/keys"),
        ("DELETE", "/v1/keys/{key_id}"),
    }
    error = schema["components"]["schemas"]["ErrorResponse"]
    assert error["required"] == ["error"]


def test_access_log_names_route_status_and_key_but_no_text(service, tokens, caplog):
    secret_text = "my bank PIN is 4711"
    with (
        caplog.at_level(logging.INFO, logger="hybridmem_local.service.access"),
        service.client(tokens["write"]) as client,
    ):
        client.post("/v1/namespaces/alice/search", json={"query": secret_text}).raise_for_status()
        client.get("/v1/namespaces/alice/memories", params={"kind": "episode"}).raise_for_status()
    lines = [r.getMessage() for r in caplog.records if r.name == "hybridmem_local.service.access"]
    assert any(line.startswith("POST /v1/namespaces/{namespace}/search 200 key=") for line in lines), lines
    assert not any(secret_text in line or tokens["write"] in line or "kind=episode" in line for line in lines)


def test_rate_limit_answers_429_with_retry_after(tmp_path, hashing_embedder, tiny_llm):
    with live_service(
        tmp_path / "memory.db",
        hashing_embedder,
        tiny_llm,
        start_worker=False,
        **{"service.rate_limit_per_s": 1.0, "service.rate_limit_burst": 3},
    ) as svc:
        token = svc.state.keys.create(["alice"], "read")[1]
        other = svc.state.keys.create(["alice"], "read")[1]
        with svc.client(token) as client, svc.client(other) as neighbour:
            statuses = [client.get("/v1/namespaces/alice/stats").status_code for _ in range(4)]
            assert statuses[:3] == [200, 200, 200] and statuses[3] == 429
            refused = client.get("/v1/namespaces/alice/stats")
            assert refused.json()["error"]["code"] == "rate_limited"
            wait = int(refused.headers["Retry-After"])
            assert 1 <= wait <= 2
            assert neighbour.get("/v1/namespaces/alice/stats").status_code == 200  # buckets are per key
            time.sleep(wait)
            assert client.get("/v1/namespaces/alice/stats").status_code == 200


def test_a_full_queue_answers_503_and_stores_nothing(tmp_path, hashing_embedder, tiny_llm):
    with live_service(
        tmp_path / "memory.db", hashing_embedder, tiny_llm, start_worker=False, **{"service.max_pending_sessions": 2}
    ) as svc:
        token = svc.state.keys.create(["alice"], "write")[1]
        with svc.client(token) as client:
            assert client.post("/v1/namespaces/alice/sessions", json=session_body("q1", ["one"])).status_code == 202
            full = client.post(
                "/v1/namespaces/alice/sessions/batch",
                json={"sessions": [session_body("q2", ["two"]), session_body("q3", ["three"])]},
            )
            assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
            assert "max_pending_sessions" in full.json()["error"]["message"]
            assert client.get("/v1/namespaces/alice/sessions/q2").status_code == 404
            assert client.post("/v1/namespaces/alice/sessions", json=session_body("q2", ["two"])).status_code == 202


def test_ask_answers_504_when_the_llm_stays_busy(tmp_path, hashing_embedder, tiny_llm):
    with live_service(
        tmp_path / "memory.db", hashing_embedder, tiny_llm, start_worker=False, **{"service.ask_timeout_s": 0.5}
    ) as svc:
        token = svc.state.keys.create(["alice"], "read")[1]
        with svc.state.llm.lock, svc.client(token) as client:  # the LLM busy (as if curating) all along
            started = time.perf_counter()
            response = client.post("/v1/namespaces/alice/ask", json={"question": "Where does Alice live?"})
            waited = time.perf_counter() - started
    assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
    assert 0.4 < waited < 5


def test_no_auth_mode_serves_without_a_key(tmp_path, hashing_embedder, tiny_llm):
    with (
        live_service(tmp_path / "memory.db", hashing_embedder, tiny_llm, start_worker=False, require_auth=False) as svc,
        svc.client() as client,
    ):
        response = client.post("/v1/namespaces/anyone/memories", json={"tuples": [TUPLES[0]]})
        assert response.status_code == 201, response.text
        assert client.get("/v1/keys").status_code == 200


@pytest.mark.slow
def test_ask_with_the_default_smollm2(tmp_path, minilm):
    """The configured llama.cpp SmolLM2 (built by the state, as `hybridmem serve` does) answers."""
    with live_service(tmp_path / "memory.db", minilm, None, start_worker=False) as svc:
        token = svc.state.keys.create(["alice"], "write")[1]
        with svc.client(token) as client:
            client.post(
                "/v1/namespaces/alice/memories", json={"episodes": EPISODES, "tuples": TUPLES}
            ).raise_for_status()
            response = client.post("/v1/namespaces/alice/ask", json={"question": "What is the name of Alice's puppy?"})
    assert response.status_code == 200, response.text
    answer = Answer.model_validate(response.json())
    # SmolLM2-135M's wording is poor (it may answer with the short id); its citation is the check.
    assert answer.answer and answer.error is None
    assert "Biscuit" in [getattr(m, "title", None) for m in answer.cited]


def test_ask_without_a_usable_llm_answers_503_naming_the_problem(tmp_path, hashing_embedder):
    missing = tmp_path / "no-such-model.gguf"
    with live_service(
        tmp_path / "memory.db", hashing_embedder, None, start_worker=False, **{"llm.path": str(missing)}
    ) as svc:
        token = svc.state.keys.create(["alice"], "read")[1]
        with svc.client(token) as client:
            response = client.post("/v1/namespaces/alice/ask", json={"question": "Where does Alice live?"})
            assert client.get("/v1/namespaces/alice/stats").status_code == 200  # the rest still serves
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "not_ready" and str(missing) in response.json()["error"]["message"]
