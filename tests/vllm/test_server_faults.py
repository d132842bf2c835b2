"""Faults against the real ``vllm serve``: a prompt over the context window, a server that is not
there, and one killed mid-batch then restarted. Each ends in a retry, a clean
``curation_failed`` or a clear error, and no stored session is lost. These run last (file
order): they kill and restart the session's server and leave it running again.
"""

from __future__ import annotations

import threading
import time

import pytest

from hybridmem_local.config import LLMConfig
from hybridmem_local.errors import LLMError
from hybridmem_local.llm import ChatMessage, LLMRequest, build_llm


def _ask(content: str, max_new_tokens: int = 32) -> LLMRequest:
    return LLMRequest(messages=[ChatMessage(role="user", content=content)], max_new_tokens=max_new_tokens)


def test_a_prompt_over_the_context_window_is_a_permanent_error_not_retried(server_config):
    llm = build_llm(server_config.llm)
    started = time.perf_counter()
    short, long = llm.generate([_ask("Say hi."), _ask("word " * 5000)])
    assert short.ok
    assert long.error.startswith("server answered HTTP 400") and "maximum context length" in long.error
    # permanent: no retry, no backoff sleeps
    assert time.perf_counter() - started < 30


def test_an_unreachable_server_is_a_clear_error():
    config = LLMConfig(
        backend="openai-server", model="smollm2-135m-instruct-hf", base_url="http://127.0.0.1:9/v1", timeout_s=5
    )
    with pytest.raises(LLMError, match=r"cannot reach the OpenAI-compatible server at http://127.0.0.1:9/v1"):
        build_llm(config)


def test_server_killed_mid_batch_then_restarted_loses_no_session(
    server, server_config, minilm_cpu, locomo_path, tmp_path
):
    from hybridmem_local.eval.locomo import load_locomo
    from hybridmem_local.memory import HybridMemory

    sessions = load_locomo(locomo_path).conversations[0].sessions[1:3]
    config = server_config.model_copy(update={"llm": server_config.llm.model_copy(update={"max_retries": 1})})
    with HybridMemory.open(tmp_path / "m.db", config, minilm_cpu) as memory:
        llm = memory.llm  # connects now, while the server is up
        killer = threading.Timer(6.0, server.kill)
        killer.start()
        try:
            report = memory.ingest(sessions)
        finally:
            killer.join()
        # the batch failed cleanly: every session stored, raw turns kept, marked for a retry
        assert report.stored == 2 and report.failed == 2 and report.curated == 0
        for session in sessions:
            record = memory.store.sessions.get(session.namespace, session.session_id)
            assert record.curation_status == "curation_failed"
            assert "cannot reach" in record.curation_error or "HTTP" in record.curation_error
            assert [t.turn_id for t in record.session.turns] == [t.turn_id for t in session.turns]

        # while it is down: the same client fails fast with the reason, no exception
        [down] = llm.generate([_ask("Say hi.")])
        assert not down.ok and "cannot reach" in down.error

        server.start()  # restarted: the same backend object works again
        retried = memory.curate_pending(retry_failed=True)
        assert retried.curated + retried.failed == 2
        for session in sessions:
            record = memory.store.sessions.get(session.namespace, session.session_id)
            assert record.curation_status in {"curated", "curation_failed"}
            assert len(record.session.turns) == len(session.turns)
        assert retried.curated >= 1, [
            memory.store.sessions.get(s.namespace, s.session_id).curation_error for s in sessions
        ]
