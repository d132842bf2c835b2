"""The audit trail over the service: every route of the HTTP API and the MCP tools leaves one
entry with the request's key id, its route and its namespace, and never the text of a request.

Requests go to a real ``hybridmem serve`` stack (uvicorn on 127.0.0.1, tests/service/http_harness.py)
whose LLM is the scripted ``vllm serve`` stand-in (tests/service/scripted_llm.py). Which key
calls which route on which namespace is drawn with a seeded RNG; every request carries a marker
string of its own in its text (turns, queries, questions, reasons, labels), and no marker may
appear in any audit row, read raw from the file.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest

from hybridmem_local.storage.store import MemoryStore
from tests.fake_vllm_server import ChatServer
from tests.service.http_harness import live_service, session_body
from tests.service.scripted_llm import llm_settings, respond

NAMESPACES = ["north", "south", "east"]
NS = "/v1/namespaces/{namespace}"


@pytest.fixture(scope="module")
def chat_server():
    server = ChatServer(respond)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def service(tmp_path_factory, hashing_embedder, chat_server):
    with live_service(
        tmp_path_factory.mktemp("audit") / "memory.db", hashing_embedder, None, **llm_settings(chat_server)
    ) as svc:
        yield svc


@dataclass
class Keys:
    """Per namespace a read, a write and an admin key; one admin key of every namespace; tokens by key id."""

    by_role: dict[tuple[str, str], list[str]]
    tokens: dict[str, str]


@pytest.fixture(scope="module")
def keys(service) -> Keys:
    ring = service.state.keys
    by_role: dict[tuple[str, str], list[str]] = {}
    tokens: dict[str, str] = {}
    for namespace in NAMESPACES:
        for role in ("read", "write", "admin"):
            key, token = ring.create([namespace], role)
            tokens[key.key_id] = token
            # A key of a higher role may do what a lower one does.
            for lower in ("read", "write", "admin")[: ("read", "write", "admin").index(role) + 1]:
                by_role.setdefault((namespace, lower), []).append(key.key_id)
    everything, token = ring.create(["*"], "admin")
    tokens[everything.key_id] = token
    for namespace in NAMESPACES:
        for role in ("read", "write", "admin"):
            by_role[(namespace, role)].append(everything.key_id)
    return Keys(by_role, tokens)


def audit_rows(db, after_id: int = 0, worker: bool = False) -> list[dict[str, Any]]:
    """The audit entries after ``after_id``, read on a connection of their own; the curation
    worker's (it curates what the requests queue, whenever it gets to it) only with ``worker``."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM audit_log WHERE id > ? ORDER BY id", (after_id,))]
    finally:
        conn.close()
    return [r for r in rows if worker or r["actor"] != "worker"]


def last_id(db) -> int:
    rows = audit_rows(db, worker=True)
    return rows[-1]["id"] if rows else 0


@dataclass
class Call:
    """One request: its route as the audit names it, the role it needs, and how to make it."""

    method: str
    template: str
    role: str
    send: Callable[[httpx.Client, str, str, dict[str, Any]], httpx.Response]


def _memory_id(ctx: dict[str, Any], namespace: str) -> int:
    return ctx["memories"].get(namespace, [999_999])[0]


def _add_memories(client: httpx.Client, namespace: str, marker: str, ctx: dict[str, Any]) -> httpx.Response:
    body = {
        "episodes": [{"title": marker, "summary": f"{marker} s", "details": f"{marker} d", "timestamp": "2023-05-05"}],
        "tuples": [{"entity": "Alice", "relation": "said", "object": marker, "timestamp": "2023-05-05"}],
    }
    response = client.post(f"/v1/namespaces/{namespace}/memories", json=body)
    if response.status_code == 201:
        ctx["memories"].setdefault(namespace, []).extend(response.json()["ids"])
    return response


def _add_session(client: httpx.Client, namespace: str, marker: str, ctx: dict[str, Any]) -> httpx.Response:
    session_id = f"s{ctx['counter']}"
    ctx["counter"] += 1
    response = client.post(f"/v1/namespaces/{namespace}/sessions", json=session_body(session_id, [marker, marker]))
    if response.status_code == 202:
        ctx["sessions"].setdefault(namespace, []).append(session_id)
    return response


def _batch(client: httpx.Client, namespace: str, marker: str, ctx: dict[str, Any]) -> httpx.Response:
    session_id = f"b{ctx['counter']}"
    ctx["counter"] += 1
    return client.post(
        f"/v1/namespaces/{namespace}/sessions/batch", json={"sessions": [session_body(session_id, [marker])]}
    )


def _get_session(client: httpx.Client, namespace: str, marker: str, ctx: dict[str, Any]) -> httpx.Response:
    session_id = ctx["sessions"].get(namespace, ["missing"])[0]
    return client.get(f"/v1/namespaces/{namespace}/sessions/{session_id}")


CALLS = [
    Call("POST", NS + "/sessions", "write", _add_session),
    Call("POST", NS + "/sessions/batch", "write", _batch),
    Call(
        "POST",
        NS + "/messages",
        "write",
        lambda c, ns, marker, ctx: c.post(
            f"/v1/namespaces/{ns}/messages", json={"messages": [{"role": "user", "content": marker}]}
        ),
    ),
    Call("GET", NS + "/sessions/{session_id}", "read", _get_session),
    Call("POST", NS + "/memories", "write", _add_memories),
    Call("GET", NS + "/memories", "read", lambda c, ns, marker, ctx: c.get(f"/v1/namespaces/{ns}/memories")),
    Call(
        "GET",
        NS + "/memories/{memory_id}",
        "read",
        lambda c, ns, marker, ctx: c.get(f"/v1/namespaces/{ns}/memories/{_memory_id(ctx, ns)}"),
    ),
    Call(
        "GET",
        NS + "/memories/{memory_id}/history",
        "read",
        lambda c, ns, marker, ctx: c.get(f"/v1/namespaces/{ns}/memories/{_memory_id(ctx, ns)}/history"),
    ),
    Call(
        "DELETE",
        NS + "/memories/{memory_id}",
        "write",
        lambda c, ns, marker, ctx: c.delete(
            f"/v1/namespaces/{ns}/memories/{ctx['memories'].get(ns, [999_999])[-1]}", params={"reason": marker}
        ),
    ),
    Call(
        "POST",
        NS + "/search",
        "read",
        lambda c, ns, marker, ctx: c.post(f"/v1/namespaces/{ns}/search", json={"query": f"what about {marker}"}),
    ),
    Call(
        "POST",
        NS + "/ask",
        "read",
        lambda c, ns, marker, ctx: c.post(f"/v1/namespaces/{ns}/ask", json={"question": f"what of {marker}?"}),
    ),
    Call("GET", NS + "/export", "read", lambda c, ns, marker, ctx: c.get(f"/v1/namespaces/{ns}/export")),
    Call("GET", NS + "/stats", "read", lambda c, ns, marker, ctx: c.get(f"/v1/namespaces/{ns}/stats")),
    Call(
        "POST",
        NS + "/consolidate",
        "admin",
        lambda c, ns, marker, ctx: c.post(f"/v1/namespaces/{ns}/consolidate", json={"dry_run": True}),
    ),
    Call(
        "POST",
        NS + "/consolidation-runs/{run_id}/undo",
        "admin",
        lambda c, ns, marker, ctx: c.post(f"/v1/namespaces/{ns}/consolidation-runs/424242/undo"),
    ),
]


def test_every_route_leaves_one_entry_with_its_key_route_and_namespace_and_no_text(service, keys):
    rng = random.Random(25)
    db = service.db
    ctx: dict[str, Any] = {"memories": {}, "sessions": {}, "counter": 0}
    markers: list[str] = []
    seen: set[tuple[str, str]] = set()
    # Every route at least twice, in a seeded random order, each by a random key: mostly one
    # that may (ok), sometimes one of another namespace (refused, and audited as refused).
    drawn = [call for call in CALLS for _ in range(2)] + [rng.choice(CALLS) for _ in range(20)]
    rng.shuffle(drawn)
    # Memories first in each namespace, so that reads find something.
    plan = [(CALLS[4], namespace, True) for namespace in NAMESPACES] + [
        (call, rng.choice(NAMESPACES), rng.random() > 0.15) for call in drawn
    ]
    for i, (call, namespace, allowed) in enumerate(plan):
        if allowed:
            key_id = rng.choice(keys.by_role[(namespace, call.role)])
        else:
            other = rng.choice([ns for ns in NAMESPACES if ns != namespace])
            key_id = keys.by_role[(other, "admin")][0]  # reaches only `other`
        marker = f"MARKER{i:03d}q{rng.randrange(10**9)}"
        markers.append(marker)
        before = last_id(db)
        with service.client(keys.tokens[key_id]) as client:
            response = call.send(client, namespace, marker, ctx)
        assert response.status_code < 500, (call.template, response.text)
        assert service.state.flush_audit(10)
        rows = audit_rows(db, before)
        assert len(rows) == 1, (call.template, rows)
        [row] = rows
        assert row["actor"] == key_id
        assert row["action"] == f"{call.method} {call.template}"
        assert row["namespace"] == namespace
        if allowed:
            seen.add((call.method, call.template))
        if response.status_code < 400:
            assert row["outcome"] == "ok"
        else:
            assert row["outcome"] == response.json()["error"]["code"], (call.template, response.text)
            if not allowed:
                assert row["outcome"] == "forbidden"
        refs = json.loads(row["refs"])
        if call.template.endswith("/search") and response.status_code == 200:
            found = response.json()
            assert refs.get("read", []) == [h["memory"]["id"] for h in found["episodes"] + found["tuples"]]
        if call.template.endswith("/ask") and response.status_code == 200:
            answer = response.json()
            assert refs.get("context", []) == answer["context_memory_ids"]
            assert refs.get("cited", []) == answer["cited_memory_ids"]
        if call.method == "POST" and call.template.endswith("/memories") and response.status_code == 201:
            assert refs["changed"] == response.json()["ids"]
    assert seen == {(c.method, c.template) for c in CALLS}, "every route ran with a key that may"

    # The key routes and forgetting a namespace, by the all-namespace admin key.
    admin_id = keys.by_role[("north", "admin")][-1]
    label = "MARKERlabel7"
    markers.append(label)
    with service.client(keys.tokens[admin_id]) as client:
        before = last_id(db)
        created = client.post("/v1/keys", json={"namespaces": ["east"], "role": "read", "label": label}).json()
        client.get("/v1/keys")
        client.delete(f"/v1/keys/{created['key']['key_id']}")
        forgotten = client.delete("/v1/namespaces/east")
        assert forgotten.status_code == 200
    assert service.state.flush_audit(10)
    rows = audit_rows(db, before)
    assert [(r["actor"], r["action"]) for r in rows] == [
        (admin_id, "POST /v1/keys"),
        (admin_id, "GET /v1/keys"),
        (admin_id, "DELETE /v1/keys/{key_id}"),
        (admin_id, "DELETE /v1/namespaces/{namespace}"),
    ]
    assert created["key"]["key_id"] in json.loads(rows[0]["refs"])["keys"]
    assert rows[-1]["namespace"] == "east" and rows[-1]["outcome"] == "ok"

    # No request text, and no key secret, anywhere in the audit rows, read raw from the file.
    conn = sqlite3.connect(db)
    raw = repr(conn.execute("SELECT * FROM audit_log").fetchall()) + repr(
        conn.execute("SELECT * FROM audit_anchor").fetchall()
    )
    conn.close()
    leaked = [m for m in markers if m in raw]
    assert not leaked, leaked
    assert not [t for t in [*keys.tokens.values(), created["token"]] if t in raw]
    # The worker's curation of the queued sessions is there too, as the worker's (and its retry of
    # the forget's scrub, when a reader held that up).
    curated = [r for r in audit_rows(db, worker=True) if r["actor"] == "worker"]
    assert curated and {r["action"] for r in curated} <= {
        "HybridMemory.curate_stored",
        "HybridMemory.mark_curation_failed",
        "HybridMemory.retry_pending_scrubs",
    }
    # Forgetting "east" left its audit entries (ids, not text) and the chain verifies.
    store = MemoryStore(db)
    try:
        assert store.audit.entries(namespace="east")
        verdict = store.audit.verify()
        assert verdict.ok, verdict
    finally:
        store.close()


def test_an_admin_key_of_every_namespace_reads_the_audit_over_http(service, keys):
    everything = keys.by_role[("north", "admin")][-1]
    north_admin = keys.by_role[("north", "admin")][0]
    with service.client(keys.tokens[north_admin]) as client:
        refused = client.get("/v1/audit")
        assert refused.status_code == 403 and "every namespace" in refused.json()["error"]["message"]
    assert service.state.flush_audit(10)
    with service.client(keys.tokens[everything]) as client:
        entries = client.get("/v1/audit", params={"key": north_admin, "limit": 1000}).json()
        assert entries[-1]["action"] == "GET /v1/audit" and entries[-1]["outcome"] == "forbidden"
        assert {e["actor"] for e in entries} == {north_admin}
        page = client.get("/v1/audit", params={"limit": 2}).json()
        assert [e["id"] for e in page] == [1, 2]
        assert client.get("/v1/audit", params={"limit": 0}).status_code == 422


def test_health_routes_and_refused_keys_leave_no_entry(service, keys):
    """No key, no actor: /healthz, /readyz and a request without a valid key are only in the
    access log (an unauthenticated flood must not fill the store)."""
    before = last_id(service.db)
    with service.client() as anonymous, service.client("hm_00000000_bad") as bad:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        assert anonymous.post("/v1/namespaces/north/search", json={"query": "MARKERanon"}).status_code == 401
        assert bad.post("/v1/namespaces/north/search", json={"query": "MARKERbad"}).status_code == 401
    assert service.state.flush_audit(10)
    assert audit_rows(service.db, before) == []


def test_mcp_tool_calls_are_audited_by_tool_key_and_namespace(service, keys):
    from contextlib import AsyncExitStack

    import httpx as httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    key_id = keys.by_role[("south", "write")][0]
    token = keys.tokens[key_id]
    marker = "MARKERmcp31"

    async def main() -> None:
        async with AsyncExitStack() as stack:
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            read, write = await stack.enter_async_context(
                streamable_http_client(f"{service.url}/mcp", http_client=client)
            )
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            result = await session.call_tool("search", {"query": f"where is {marker}"})
            assert not result.is_error
            result = await session.call_tool("remember", {"text": f"remember {marker}"})
            assert not result.is_error

    before = last_id(service.db)
    anyio.run(main)
    assert service.state.flush_audit(10)
    rows = audit_rows(service.db, before)
    tools = [r for r in rows if r["action"].startswith("MCP ")]
    assert [(r["action"], r["actor"], r["namespace"], r["outcome"]) for r in tools] == [
        ("MCP search", key_id, "south", "ok"),
        ("MCP remember", key_id, "south", "ok"),
    ]
    assert json.loads(tools[1]["refs"])["sessions"]
    # The protocol's own requests (initialize, ...) are entries of the key on POST /mcp.
    assert {r["action"] for r in rows} - {"MCP search", "MCP remember"} <= {"POST /mcp"}
    assert all(r["actor"] == key_id for r in rows)
    assert marker not in repr(rows)
