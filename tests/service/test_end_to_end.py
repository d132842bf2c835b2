"""The service on the embedded default, for real: uvicorn on 127.0.0.1, the curation worker on
the default LLM (Qwen2.5-Coder-1.5B on llama.cpp), MiniLM, and the Python client. The other
service tests stand a scripted ``vllm serve`` in for the LLM to control timing and replies;
this one checks the real stack joins up.
"""

from __future__ import annotations

import time

import pytest

from hybridmem_local.cli.main import DEMO_SESSIONS
from hybridmem_local.files.session_files import read_sessions_jsonl
from hybridmem_local.service.client import HybridMemoryClient
from hybridmem_local.service.keys import Role
from tests.service.http_harness import live_service


@pytest.mark.slow
def test_a_session_added_over_http_is_curated_by_the_worker_and_answered_from(tmp_path, minilm):
    session = read_sessions_jsonl(DEMO_SESSIONS, "demo")[0]
    with live_service(tmp_path / "memory.db", minilm, None, **{"service.worker_poll_s": 0.2}) as service:
        _, token = service.state.keys.create(["demo"], Role.write)
        with HybridMemoryClient(service.url, token, timeout=600) as client:
            accepted = client.add_session(session)
            assert accepted.curation_status == "pending"
            deadline = time.monotonic() + 600
            while (record := client.get_session("demo", session.session_id)).curation_status == "pending":
                assert time.monotonic() < deadline, "the worker did not curate the session in 10 minutes"
                time.sleep(1)
            assert record.curation_status == "curated", record.curation_error

            turn_ids = {t.turn_id for t in session.turns}
            memories = client.list("demo")
            assert memories, "curation stored no memory"
            assert all(m.source_session_id == session.session_id for m in memories)
            assert all(set(m.source_turn_ids) <= turn_ids for m in memories)

            result = client.search("Alice's beagle puppy Biscuit", namespace="demo")
            assert {hit.memory.id for hit in result.episodes + result.tuples} <= {m.id for m in memories}
            assert result.episodes or result.tuples

            answer = client.answer("What is the name of Alice's puppy?", namespace="demo")
            assert answer.error is None
            assert answer.answer.strip()
            assert {m.id for m in answer.cited} <= {m.id for m in memories}
