"""What a generic agent needs, tried as one would: plain text and chat messages in (HTTP, the
Python client, in-process alike), a namespace reset only for an admin key of that namespace, and
back-to-back calls within the documented rate limit never refused.

The service runs on uvicorn on 127.0.0.1 with the documented default limits; the LLM is the
scripted ``vllm serve`` stand-in (tests/service/scripted_llm.py). The MCP tools' tour over stdio
and HTTP, the new tools included, is in test_mcp.py.
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from hybridmem_local.config import ServiceConfig
from hybridmem_local.errors import InvalidInputError
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Message, Session
from hybridmem_local.service.client import HybridMemoryClient
from tests.fake_vllm_server import ChatServer
from tests.service.http_harness import live_service
from tests.service.scripted_llm import llm_settings, respond

DEFAULTS = ServiceConfig()
#: The documented limits (docs/deployment.md, "Limits"): what the burst test holds the service to.
DOCUMENTED_RATE, DOCUMENTED_BURST = 20.0, 40
CHAT = [
    Message(role="user", content="We adopted a beagle puppy called Biscuit."),
    Message(role="assistant", content="Congratulations! How old is Biscuit?"),
    Message(role="user", name="Alice", content="Ten weeks."),
]


@pytest.fixture(scope="module")
def chat_server():
    server = ChatServer(respond)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def service(tmp_path_factory, hashing_embedder, chat_server):
    assert (DEFAULTS.rate_limit_per_s, DEFAULTS.rate_limit_burst) == (DOCUMENTED_RATE, DOCUMENTED_BURST)
    limits = {"service.rate_limit_per_s": DOCUMENTED_RATE, "service.rate_limit_burst": DOCUMENTED_BURST}
    db = tmp_path_factory.mktemp("agents") / "memory.db"
    with live_service(db, hashing_embedder, None, **llm_settings(chat_server, **limits)) as svc:
        yield svc


def wait_curated(client: HybridMemoryClient, namespace: str, session_id: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while (record := client.get_session(namespace, session_id)).curation_status == "pending":
        assert time.monotonic() < deadline, "the worker did not curate the session"
        time.sleep(0.2)
    return record


def test_messages_and_plain_text_over_http_and_the_client(service):
    _, token = service.state.keys.create(["alice"], "write")
    with service.client(token) as http:
        response = http.post(
            "/v1/namespaces/alice/messages",
            json={"messages": [m.model_dump(exclude_none=True) for m in CHAT], "session_id": "puppy-chat"},
        )
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert (accepted["session_id"], accepted["curation_status"]) == ("puppy-chat", "pending")
        for bad, field in [({"messages": []}, "messages"), ({"messages": [{"role": "user", "content": " "}]}, "blank")]:
            refused = http.post("/v1/namespaces/alice/messages", json=bad)
            assert refused.status_code == 422 and refused.json()["error"]["code"] == "validation_error"
            assert field in refused.json()["error"]["message"]

    with HybridMemoryClient(service.url, api_key=token) as client:
        stored = wait_curated(client, "alice", "puppy-chat")
        # Dated by the server now; turn i is session_id:i, spoken by the name, else the role.
        expected = Session.from_messages("alice", CHAT, "puppy-chat", stored.session.started_at)
        assert stored.curation_status == "curated" and stored.session == expected
        assert [t.speaker for t in stored.session.turns] == ["user", "assistant", "Alice"]
        assert abs(time.time() - stored.session.started_at.timestamp()) < 120

        noted = client.remember("alice", "Alice's sister Ana lives in Lyon.")
        chat = client.add_messages("alice", CHAT)
        for record in (noted, chat):
            assert record.curation_status == "pending"
            assert wait_curated(client, "alice", record.session.session_id).session == record.session
        assert [t.speaker for t in noted.session.turns] == ["user"]
        found = client.search("Ana lives in Lyon", namespace="alice", kinds=["tuple"])
        assert any(noted.session.turns[0].turn_id in hit.memory.source_turn_ids for hit in found.tuples)
        with pytest.raises(InvalidInputError, match="blank"):
            client.remember("alice", "  ")


def test_messages_in_process_are_the_same_session(tmp_path):
    with HybridMemory.open(tmp_path / "m.db") as memory:  # queued only: no embedder, no LLM
        record = memory.add_messages("alice", CHAT, session_id="chat-1")
        assert record.session == Session.from_messages("alice", CHAT, "chat-1", record.session.started_at)
        assert memory.get_session("alice", "chat-1") == record
        noted = memory.remember("alice", "Ana lives in Lyon.")
        assert noted.session.turns[0].speaker == "user" and noted.curation_status == "pending"
        with pytest.raises(InvalidInputError, match="session_id must be 1-50 characters"):
            memory.add_messages("alice", CHAT, session_id="x" * 51)


def connect(base_url: str, token: str):
    return streamable_http_client(
        f"{base_url}/mcp", http_client=httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    )


async def open_session(stack: AsyncExitStack, base_url: str, token: str) -> ClientSession:
    read, write = await stack.enter_async_context(connect(base_url, token))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


def text_of(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_reset_namespace_needs_an_admin_key_of_that_namespace(service):
    keys = service.state.keys
    _, writer = keys.create(["carol"], "write")
    _, other_admin = keys.create(["dave"], "admin")
    _, admin = keys.create(["carol"], "admin")

    async def main() -> None:
        async with AsyncExitStack() as stack:
            as_writer = await open_session(stack, service.url, writer)
            queued = (await as_writer.call_tool("remember", {"text": "Carol plays the cello."})).structured_content
            for token, expected in [(writer, "needs the admin role"), (other_admin, "does not reach namespace")]:
                session = await open_session(stack, service.url, token)
                result = await session.call_tool("reset_namespace", {"namespace": "carol"})
                assert result.is_error and text_of(result).startswith("forbidden: ") and expected in text_of(result)
            status = await as_writer.call_tool("session_status", {"session_id": queued["session_id"]})
            assert not status.is_error  # nothing was reset

            as_admin = await open_session(stack, service.url, admin)
            reset = await as_admin.call_tool("reset_namespace", {})
            assert not reset.is_error and reset.structured_content["namespace"] == "carol"
            assert reset.structured_content["removed"]["sessions"] == 1
            gone = await as_writer.call_tool("session_status", {"session_id": queued["session_id"]})
            assert gone.is_error and text_of(gone).startswith("not_found: ")

    anyio.run(main)
    with service.state.memory() as memory:
        assert "carol" not in memory.stats().namespaces


def test_back_to_back_calls_within_the_documented_rate_limit_get_no_429(service):
    """A burst of DOCUMENTED_BURST requests at once, then DOCUMENTED_RATE a second: none refused."""
    _, mcp_token = service.state.keys.create(["erin"], "write")
    _, http_token = service.state.keys.create(["erin"], "read")
    statuses: list[int] = []

    async def count(response: httpx2.Response) -> None:
        statuses.append(response.status_code)

    async def main() -> None:
        client = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {mcp_token}"}, timeout=60, event_hooks={"response": [count]}
        )
        mcp_url = f"{service.url}/mcp"
        async with (
            streamable_http_client(mcp_url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            # The burst, the requests of the handshake included.
            while len(statuses) < DOCUMENTED_BURST:
                result = await session.call_tool("search", {"query": "cello"})
                assert not result.is_error, text_of(result)
            # Then calls paced at the documented rate for two seconds.
            started = time.monotonic()
            for i in range(int(2 * DOCUMENTED_RATE)):
                await anyio.sleep(max(0.0, started + (i + 1) / DOCUMENTED_RATE - time.monotonic()))
                result = await session.call_tool("search", {"query": "cello"})
                assert not result.is_error, text_of(result)

    anyio.run(main)
    assert len(statuses) >= DOCUMENTED_BURST + 2 * DOCUMENTED_RATE and set(statuses) <= {200, 202}, statuses

    with HybridMemoryClient(service.url, api_key=http_token) as client:
        for _ in range(DOCUMENTED_BURST):
            client.stats("erin")  # a 429 would raise RateLimitedError
