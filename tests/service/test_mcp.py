"""The MCP server through the MCP SDK's own client: every tool listed and called over stdio
(``hybridmem mcp`` spawned as a subprocess) and over streamable HTTP (``/mcp`` of the app on
uvicorn on 127.0.0.1), where the bearer key decides which namespaces a tool may touch.

Nothing in the app is replaced. The LLM is the openai-server backend against a real HTTP server on
127.0.0.1 answering like ``vllm serve`` with fixed replies (tests/service/scripted_llm.py): each
session is curated into one episode and one tuple per turn, every question answered citing E1.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import yaml
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic_core import to_jsonable_python

from hybridmem_local.config import load_config
from hybridmem_local.results import Answer, SearchResult
from hybridmem_local.schema import EpisodeDraft, TupleDraft
from hybridmem_local.service.app import create_app
from hybridmem_local.service.mcp_server import build_mcp_server
from hybridmem_local.service.operations import FixedNamespace, Operations
from hybridmem_local.service.state import ServiceState
from tests.fake_vllm_server import ChatServer
from tests.service.live import REPO, ThreadedServer
from tests.service.scripted_llm import ANSWER, llm_settings, respond

TOOLS = {
    "remember",
    "add_messages",
    "session_status",
    "add_session",
    "add_memory",
    "search",
    "ask",
    "list_memories",
    "delete_memory",
    "reset_namespace",
    "list_redactions",
    "undo_redaction",
    "confirm_redaction",
}
NOTE = "My sister Ana lives in Lyon."
CHAT = [
    {"role": "user", "content": "I adopted a cat named Miso."},
    {"role": "assistant", "content": "Lovely! How old is Miso?"},
]
QUESTION = "What is the name of Alice's puppy?"
EPISODE = {
    "title": "Biscuit",
    "summary": "Alice adopted a puppy",
    "details": "Alice adopted a beagle puppy named Biscuit.",
    "timestamp": "2023-05-05",
}
TUPLE = {"entity": "Alice", "relation": "adopted", "object": "Biscuit the beagle", "timestamp": "2023-05-05"}
STARTED_AT = datetime(2023, 5, 7, 10, 0, tzinfo=timezone.utc).isoformat()


def turns(session_id: str) -> list[dict[str, str]]:
    return [
        {"turn_id": f"{session_id}:0", "speaker": "Alice", "text": "We moved to a flat on Oak Avenue last week."},
        {"turn_id": f"{session_id}:1", "speaker": "Bob", "text": "Nice! Is there room for Biscuit to run around?"},
    ]


@pytest.fixture(scope="module")
def chat_server():
    server = ChatServer(respond)
    yield server
    server.stop()


# --------------------------------------------------------------------------- a tour of every tool


def text_of(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


async def call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    return result.structured_content


async def refused(session: ClientSession, tool: str, arguments: dict[str, Any]) -> str:
    """The error text of a tool call that must fail."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, f"{tool} {arguments} should have failed: {result.structured_content}"
    return text_of(result)


async def wait_for(fetch: Callable[[], Awaitable[dict]], done: Callable[[dict], bool], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"timed out; last value {value}"
        await anyio.sleep(0.1)


async def tool_tour(session: ClientSession, scope: dict[str, str], session_id: str) -> dict[str, Any]:
    """List the tools and call each one, checking what it did; ``scope`` is the namespace argument
    (empty where the connection is scoped to one namespace)."""
    listed = (await session.list_tools()).tools
    assert {tool.name for tool in listed} == TOOLS
    for tool in listed:
        # Each says when an agent should call it, takes typed input and returns typed output.
        assert "Call" in tool.description and len(tool.description) > 100, tool.name
        assert tool.input_schema["type"] == "object" and tool.output_schema is not None, tool.name

    added = await call(session, "add_memory", {"episodes": [EPISODE], "tuples": [TUPLE], **scope})
    episode_id, tuple_id = added["ids"]

    queued = await call(
        session,
        "add_session",
        {"session_id": session_id, "started_at": STARTED_AT, "turns": turns(session_id), **scope},
    )
    assert queued == {"namespace": added["namespace"], "session_id": session_id, "curation_status": "pending"}
    # The curation worker turns the queued session into memories citing its turns (1 episode, 1 tuple per turn).
    page = await wait_for(
        lambda: call(session, "list_memories", {"limit": 200, **scope}),
        lambda page: sum(m["source_session_id"] == session_id for m in page["items"]) == 3,
    )
    curated = [m for m in page["items"] if m["source_session_id"] == session_id]
    assert {t for m in curated for t in m["source_turn_ids"]} == {f"{session_id}:0", f"{session_id}:1"}

    result = SearchResult.model_validate(await call(session, "search", {"query": QUESTION, "k": 3, **scope}))
    assert result.episodes[0].memory.id == episode_id
    assert tuple_id in [hit.memory.id for hit in result.tuples]

    answer = Answer.model_validate(await call(session, "ask", {"question": QUESTION, **scope}))
    assert answer.answer == ANSWER and [m.id for m in answer.cited] == [episode_id] and answer.error is None

    deleted = await call(session, "delete_memory", {"memory_id": episode_id, "reason": "user asked", **scope})
    assert deleted["memory"]["id"] == episode_id and deleted["memory"]["status"] == "deleted"
    active = await call(session, "list_memories", {"kind": "episode", **scope})
    assert episode_id not in [m["id"] for m in active["items"]]
    gone = await call(session, "list_memories", {"status": "deleted", **scope})
    assert [m["id"] for m in gone["items"]] == [episode_id]

    # Paging: one memory per page walks every active memory once, in id order.
    seen, offset = [], 0
    while offset is not None:
        one = await call(session, "list_memories", {"limit": 1, "offset": offset, **scope})
        seen += [m["id"] for m in one["items"]]
        offset = one["next_offset"]
    assert seen == sorted(m["id"] for m in page["items"] if m["id"] != episode_id)

    assert "not_found" in await refused(session, "delete_memory", {"memory_id": 10**9, **scope})
    assert "validation_error" in await refused(session, "add_memory", {**scope})
    duplicate = await refused(
        session,
        "add_session",
        {"session_id": session_id, "started_at": STARTED_AT, "turns": turns(session_id), **scope},
    )
    assert "conflict" in duplicate

    # Plain text and chat messages: stored at once as sessions dated now, curated by the worker,
    # each turn spoken by the message's role.
    noted = await call(session, "remember", {"text": NOTE, **scope})
    chat = await call(session, "add_messages", {"messages": CHAT, **scope})
    for queued, messages in ((noted, [{"role": "user", "content": NOTE}]), (chat, CHAT)):
        assert queued["curation_status"] == "pending" and queued["namespace"] == added["namespace"]
        status = await wait_for(
            lambda queued=queued: call(session, "session_status", {"session_id": queued["session_id"], **scope}),
            lambda status: status["curation_status"] != "pending",
        )
        assert (status["curation_status"], status["turns"]) == ("curated", len(messages))
        # The scripted curator writes one tuple per turn: speaker as entity, text as object.
        found = await call(session, "list_memories", {"kind": "tuple", "limit": 200, **scope})
        said = {
            (m["entity"], m["object"], tuple(m["source_turn_ids"]))
            for m in found["items"]
            if m["source_session_id"] == queued["session_id"]
        }
        assert said == {(m["role"], m["content"], (f"{queued['session_id']}:{i}",)) for i, m in enumerate(messages)}
    assert "not_found" in await refused(session, "session_status", {"session_id": "nope", **scope})
    assert (await refused(session, "add_messages", {"messages": [], **scope})).startswith("validation_error: ")
    assert (await refused(session, "remember", {"text": "   ", **scope})).startswith("validation_error: ")
    return {"episode_id": episode_id, "tuple_id": tuple_id}


# --------------------------------------------------------------------------- stdio


def test_stdio_server_lists_and_calls_every_tool_in_its_fixed_namespace(tmp_path, chat_server):
    settings: dict[str, Any] = {}
    for dotted, value in llm_settings(chat_server).items():
        section, key = dotted.split(".", 1)
        settings.setdefault(section, {})[key] = value
    settings["embedder"] = {"backend": "hashing"}  # the server process loads no model
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings))
    db = tmp_path / "memory.db"
    server = StdioServerParameters(
        command=str(Path(sys.executable).parent / "hybridmem"),
        args=["mcp", "--namespace", "alice", "--db", str(db), "--config", str(config)],
        # One torch thread: the test shares two cores with the server; offline like every test;
        # this checkout's package, not the one installed.
        env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )

    async def main() -> None:
        with open(tmp_path / "mcp-stderr.log", "w") as errlog:
            async with stdio_client(server, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await tool_tour(session, {}, "s1")
                # Naming the fixed namespace is fine; any other is refused, and nothing lands there.
                await call(session, "search", {"query": QUESTION, "namespace": "alice"})
                text = await refused(session, "add_memory", {"episodes": [EPISODE], "namespace": "bob"})
                assert "forbidden" in text and "'alice' only" in text

    anyio.run(main)
    assert "Traceback" not in (tmp_path / "mcp-stderr.log").read_text()
    # The process closed the store cleanly on stdin EOF: everything is in the file, only in alice.
    from hybridmem_local.storage.store import MemoryStore

    store = MemoryStore(db)
    try:
        assert store.namespaces.names() == ["alice"]
        assert store.sessions.get("alice", "s1").curation_status == "curated"
        assert store.integrity_check() == "ok"
    finally:
        store.close()


def test_ask_without_a_usable_llm_is_a_not_ready_tool_error(tmp_path, hashing_embedder):
    """The same code as the HTTP API's 503 (the MCP tools had none for it)."""
    missing = tmp_path / "no-such-model.gguf"
    config = load_config(None, {"llm.path": str(missing)})
    state = ServiceState(tmp_path / "memory.db", config, embedder=hashing_embedder, start_worker=False)
    state.open()

    async def main() -> Any:
        async with Client(build_mcp_server(Operations(state), lambda ctx: FixedNamespace("alice"))) as client:
            return await client.call_tool("ask", {"question": QUESTION})

    try:
        result = anyio.run(main)
    finally:
        state.close()
    assert result.is_error and text_of(result).startswith("not_ready: ") and str(missing) in text_of(result)


def test_search_takes_the_filters_of_the_http_route(tmp_path, hashing_embedder):
    """kinds, since, until and min_score keep what ``HybridMemory.search`` keeps with them; a
    filter that does not fit is a validation_error naming it."""
    config = load_config(None, {"llm.path": str(tmp_path / "no-such-model.gguf")})  # no LLM call
    state = ServiceState(tmp_path / "memory.db", config, embedder=hashing_embedder, start_worker=False)
    state.open()
    lima = TupleDraft(entity="Alice", relation="visited", object="Lima", timestamp="2021-03-01")
    with state.memory() as memory:
        memory.add_memories("alice", episodes=[EpisodeDraft(**EPISODE)], tuples=[TupleDraft(**TUPLE), lima])
    cases: list[dict[str, Any]] = [
        {},
        {"kinds": ["tuple"]},
        {"since": date(2023, 1, 1)},
        {"until": date(2021, 12, 31), "kinds": ["tuple"]},
        {"since": datetime(2023, 5, 5, tzinfo=timezone.utc), "until": date(2023, 5, 5)},
        {"min_score": 1.0},
    ]
    wrong = [{"kinds": []}, {"kinds": ["fact"]}, {"since": "last week"}, {"min_score": "high"}]

    async def main() -> tuple[list[Any], list[Any]]:
        async with Client(build_mcp_server(Operations(state), lambda ctx: FixedNamespace("alice"))) as client:
            found = [
                await client.call_tool("search", {"query": QUESTION, "k": 3, **to_jsonable_python(filters)})
                for filters in cases
            ]
            refused = [await client.call_tool("search", {"query": QUESTION, **filters}) for filters in wrong]
            return found, refused

    try:
        found, refused = anyio.run(main)
        with state.memory() as memory:
            expected = [memory.search(QUESTION, namespace="alice", k=3, **filters) for filters in cases]
    finally:
        state.close()
    for filters, result, want in zip(cases, found, expected, strict=True):
        assert not result.is_error, text_of(result)
        assert SearchResult.model_validate(result.structured_content) == want, filters
    everything, tuples, recent, old, one_day, high = expected
    assert len(everything.episodes) == 1 and len(everything.tuples) == 2
    assert tuples.episodes == [] and len(tuples.tuples) == 2
    assert [hit.memory.object for hit in recent.tuples] == ["Biscuit the beagle"] and len(recent.episodes) == 1
    assert [hit.memory.object for hit in old.tuples] == ["Lima"] and old.episodes == []
    assert len(one_day.episodes) == 1 and [hit.memory.object for hit in one_day.tuples] == ["Biscuit the beagle"]
    assert high.episodes == [] and high.tuples == []
    for filters, result in zip(wrong, refused, strict=True):
        assert result.is_error and text_of(result).startswith("validation_error: "), (filters, text_of(result))
        assert next(iter(filters)) in text_of(result), (filters, text_of(result))


def test_stdio_server_refuses_a_bad_namespace_before_starting(tmp_path):
    import subprocess

    hybridmem = str(Path(sys.executable).parent / "hybridmem")
    done = subprocess.run(
        [hybridmem, "mcp", "--namespace", "../etc", "--db", str(tmp_path / "m.db")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 1 and "invalid namespace" in done.stderr and done.stdout == ""


# --------------------------------------------------------------------------- streamable HTTP


@pytest.fixture(scope="module")
def http_service(tmp_path_factory, hashing_embedder, chat_server):
    db = tmp_path_factory.mktemp("mcp-http") / "memory.db"
    state = ServiceState(db, load_config(None, llm_settings(chat_server)), embedder=hashing_embedder)
    state.open()
    try:
        with ThreadedServer(create_app(state)) as server:
            yield server.base_url, state
    finally:
        state.close()


def connect(base_url: str, token: str | None):
    """The SDK's streamable HTTP transport with the key in ``Authorization: Bearer``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return streamable_http_client(f"{base_url}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=60))


async def open_session(stack: Any, base_url: str, token: str) -> ClientSession:
    read, write = await stack.enter_async_context(connect(base_url, token))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


def test_http_tools_list_and_call_every_tool_with_a_single_namespace_key(http_service):
    base_url, state = http_service
    _, token = state.keys.create(["alice"], "write")

    async def main() -> None:
        from contextlib import AsyncExitStack

        async with AsyncExitStack() as stack:
            session = await open_session(stack, base_url, token)
            await tool_tour(session, {}, "h1")
            # Naming the key's namespace is the same as leaving it out.
            found = await call(session, "search", {"query": QUESTION, "namespace": "alice"})
            assert found["namespace"] == "alice"

    anyio.run(main)


def test_http_a_key_reaches_only_its_namespaces_with_its_role(http_service):
    base_url, state = http_service
    _, alice = state.keys.create(["alice2"], "write")
    _, reader = state.keys.create(["alice2"], "read")
    _, bob = state.keys.create(["bob2"], "write")
    _, both = state.keys.create(["alice2", "bob2"], "write")

    def bob_rows() -> list:
        with state.memory() as memory:
            return memory.list("bob2", status=None)

    async def main() -> None:
        from contextlib import AsyncExitStack

        async with AsyncExitStack() as stack:
            as_bob = await open_session(stack, base_url, bob)
            bob_id = (await call(as_bob, "add_memory", {"tuples": [TUPLE]}))["ids"][0]
            before = bob_rows()

            as_alice = await open_session(stack, base_url, alice)
            for tool, arguments in [
                ("add_memory", {"episodes": [EPISODE]}),
                ("add_session", {"session_id": "x", "started_at": STARTED_AT, "turns": turns("x")}),
                ("search", {"query": QUESTION}),
                ("ask", {"question": QUESTION}),
                ("list_memories", {}),
                ("delete_memory", {"memory_id": bob_id}),
            ]:
                text = await refused(as_alice, tool, {**arguments, "namespace": "bob2"})
                assert "forbidden" in text and "does not reach namespace 'bob2'" in text, text
            # The answer for a namespace that does not exist is the same: nothing is revealed.
            text = await refused(as_alice, "search", {"query": QUESTION, "namespace": "nobody"})
            assert "does not reach namespace 'nobody'" in text
            # Bob's memory id inside alice2 is simply not there.
            assert "not_found" in await refused(as_alice, "delete_memory", {"memory_id": bob_id})
            assert "validation_error" in await refused(as_alice, "search", {"query": QUESTION, "namespace": "../bob2"})

            as_reader = await open_session(stack, base_url, reader)
            await call(as_reader, "search", {"query": QUESTION})
            for tool, arguments in [("add_memory", {"episodes": [EPISODE]}), ("delete_memory", {"memory_id": 1})]:
                assert "needs the write role" in await refused(as_reader, tool, arguments)

            as_both = await open_session(stack, base_url, both)
            assert "pass namespace" in await refused(as_both, "search", {"query": QUESTION})
            assert (await call(as_both, "search", {"query": QUESTION, "namespace": "bob2"}))["namespace"] == "bob2"
            assert bob_rows() == before

    anyio.run(main)


def test_http_mcp_without_a_valid_key_is_refused_before_any_tool_runs(http_service):
    base_url, state = http_service
    key, token = state.keys.create(["alice3"], "write")
    state.keys.revoke(key.key_id)
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in [None, "Bearer hm_00000000_" + "x" * 43, f"Bearer {token}", "Basic abc"]:
        with httpx.Client(timeout=30) as client:
            response = client.post(
                f"{base_url}/mcp", json=initialize, headers={**headers, **({"Authorization": auth} if auth else {})}
            )
        assert response.status_code == 401, (auth, response.text)
        assert response.json()["error"]["code"] == "unauthorized"
    # A valid key gets through the same request.
    _, good = state.keys.create(["alice3"], "read")
    with httpx.Client(timeout=30) as client:
        response = client.post(
            f"{base_url}/mcp", json=initialize, headers={**headers, "Authorization": f"Bearer {good}"}
        )
    assert response.status_code == 200, response.text
    assert response.json()["result"]["serverInfo"]["name"] == "hybridmem"


def test_http_without_auth_accepts_only_loopback_hosts_and_origins(tmp_path, hashing_embedder, chat_server):
    """Under --no-auth no key guards /mcp, so the Host and Origin checks against DNS rebinding do:
    a web page that rebinds its own name to 127.0.0.1 must not reach the tools."""
    state = ServiceState(
        tmp_path / "memory.db",
        load_config(None, llm_settings(chat_server)),
        embedder=hashing_embedder,
        start_worker=False,
    )
    state.open()
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    accept = {"Accept": "application/json, text/event-stream"}
    try:
        with ThreadedServer(create_app(state, require_auth=False)) as server, httpx.Client(timeout=30) as client:
            assert client.post(f"{server.base_url}/mcp", json=initialize, headers=accept).status_code == 200
            rebound = client.post(
                f"{server.base_url}/mcp", json=initialize, headers={**accept, "Host": "evil.example:80"}
            )
            assert rebound.status_code == 421
            cross = client.post(
                f"{server.base_url}/mcp", json=initialize, headers={**accept, "Origin": "http://evil.example"}
            )
            assert cross.status_code == 403

            async def main() -> None:  # the SDK client gets every tool without a key
                async with connect(server.base_url, None) as (read, write), ClientSession(read, write) as session:
                    await session.initialize()
                    assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS
                    found = await call(session, "search", {"query": QUESTION, "namespace": "anyone"})
                    assert found["namespace"] == "anyone"

            anyio.run(main)
    finally:
        state.close()
