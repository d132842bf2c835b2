"""The LLM of the MCP and client tests: a real HTTP server on 127.0.0.1 answering like ``vllm serve``
(tests/fake_vllm_server.py) with replies fixed in advance, so what the service returns can be
checked exactly. The local models cannot curate within a test's time on these cores."""

from __future__ import annotations

import json
from typing import Any

from tests.fake_vllm_server import ChatServer, curation_reply

#: What every question is answered: the name, citing the first memory shown (E1).
ANSWER = "Biscuit"


def respond(body: dict, attempt: int) -> str:
    """Curation requests get one episode per window and one tuple per turn, citing their turns;
    questions get ANSWER citing E1."""
    if body["response_format"]["json_schema"]["name"] == "AnswerDraft":
        return json.dumps({"answer": ANSWER, "cited_memory_ids": ["E1"]})
    return curation_reply(body)


def llm_settings(server: ChatServer, **extra: Any) -> dict[str, Any]:
    """Dotted config keys: the LLM server answering in constrained JSON (as configs/vllm-server.yaml),
    no retries, no scheduled consolidation, a quick worker, no rate limit in the way of tests that poll."""
    return server.overrides(
        **{
            "answering.mode": "json",
            "llm.max_retries": 0,
            "curation.retry_rounds": 0,
            "consolidation.every_n_sessions": 0,
            "service.worker_poll_s": 0.1,
            "service.rate_limit_per_s": 1000.0,
            "service.rate_limit_burst": 1000,
            **extra,
        }
    )
