"""LLM faults during ``HybridMemory.ingest``: each ends in a retry that succeeds, or in a
``curation_failed`` session whose raw turns are kept and which curates once the LLM behaves,
or in a clear error before anything is stored. The session is never lost.

The LLM is the openai-server backend (official ``openai`` client, call cache, validation and
retries) talking to a real HTTP server on 127.0.0.1 that answers like ``vllm serve`` and
injects each fault (tests/fake_vllm_server.py).
"""

from __future__ import annotations

import logging

import pytest
import yaml
from typer.testing import CliRunner

from hybridmem_local.cli.main import app
from hybridmem_local.config import load_config
from hybridmem_local.errors import LLMError
from hybridmem_local.memory import HybridMemory
from tests.fake_vllm_server import ChatServer, Hangup, Sleep, Status, curation_reply, turn_lines
from tests.faults.corpus import curated_sessions, write_jsonl
from tests.faults.invariants import assert_integrity

GOOD = "good"  # placeholder: a valid CurationReply for the window the request shows
TIMEOUT_S = 0.5

#: The settings every case runs with: one validation retry, one split-in-half round.
OVERRIDES = {
    "llm.max_retries": 1,
    "llm.timeout_s": TIMEOUT_S,
    "curation.retry_rounds": 1,
    "consolidation.every_n_sessions": 0,
}


def window_key(body: dict) -> str:
    """Requests keyed by their window's first turn: a window and its halves count apart."""
    turns = turn_lines(body)
    return turns[0][0] if turns else "none"


def scripted(steps: list):
    """A responder giving ``steps[attempt - 1]`` (the last step repeats) for every window."""

    def respond(body: dict, attempt: int):
        step = steps[min(attempt, len(steps)) - 1]
        if isinstance(step, Sleep):
            return Sleep(step.seconds, curation_reply(body) if step.then == GOOD else step.then)
        return curation_reply(body) if step == GOOD else step

    return respond


# name, steps per attempt, expected status, fragment of the stored error (failures only), requests
# sent: a window gets 1 + max_retries attempts (not after a 4xx), then its two halves as many each.
CASES = [
    ("timeout-then-ok", [Sleep(3 * TIMEOUT_S, GOOD), GOOD], "curated", None, 2),
    ("timeout-always", [Sleep(3 * TIMEOUT_S, GOOD)], "curation_failed", f"no reply within {TIMEOUT_S}s", 6),
    ("http-500-then-ok", [Status(500), GOOD], "curated", None, 2),
    ("http-503-always", [Status(503)], "curation_failed", "server answered HTTP 503", 6),
    ("http-400-not-retried", [Status(400)], "curation_failed", "server answered HTTP 400", 3),
    ("hangup-then-ok", [Hangup(), GOOD], "curated", None, 2),
    ("hangup-always", [Hangup()], "curation_failed", "cannot reach", 6),
    ("truncated-json-then-ok", ['{"episodes": [{"title": "Ann', GOOD], "curated", None, 2),
    ("truncated-json-always", ['{"episodes": [{"title": "Ann'], "curation_failed", "does not match CurationReply", 6),
    (
        "schema-invalid-always",
        ['{"episodes": "none", "tuples": [{"entity": 3}]}'],
        "curation_failed",
        "does not match CurationReply",
        6,
    ),
    ("not-json-always", ["Sure! Here are the memories you asked for."], "curation_failed", "Invalid JSON", 6),
    ("think-block-then-json", ["<think>The user wants memories.</think>" + "{GOOD}"], "curated", None, 1),
    (
        "unterminated-think-always",
        ["<think>Let me think about this for a very long time"],
        "curation_failed",
        "empty reply",
        6,
    ),
    ("empty-always", [""], "curation_failed", "empty reply", 6),
    ("empty-then-ok", ["", GOOD], "curated", None, 2),
]


@pytest.fixture
def server():
    s = ChatServer(scripted([GOOD]), key=window_key)
    yield s
    s.stop()


@pytest.fixture
def session():
    return curated_sessions("alice", 1, seed=21, turns=4)[0].session


def _open(db, server, hashing_embedder, **extra) -> HybridMemory:
    return HybridMemory.open(
        db, load_config(overrides=server.overrides(**OVERRIDES, **extra)), embedder=hashing_embedder
    )


@pytest.mark.parametrize("name, steps, status, error, requests", CASES, ids=[c[0] for c in CASES])
def test_llm_fault_ends_in_a_retry_or_a_kept_failed_session(
    tmp_path, hashing_embedder, server, session, name, steps, status, error, requests
):
    if isinstance(steps[0], str) and "{GOOD}" in steps[0]:
        prefix = steps[0].replace("{GOOD}", "")
        server.respond = lambda body, attempt: prefix + curation_reply(body)
    else:
        server.respond = scripted(steps)
    db = tmp_path / "m.db"
    with _open(db, server, hashing_embedder) as memory:
        report = memory.ingest([session])
        assert len(server.requests) == requests
        record = memory.store.sessions.get("alice", session.session_id)
        assert record.session == session, "raw turns must be kept exactly"
        assert record.curation_status == status
        assert (report.stored, report.curated, report.failed) == (1, status == "curated", status != "curated")
        memories = memory.list("alice")
        if status == "curated":
            assert record.curation_error is None
            assert len(memories) == 1 + len(session.turns)  # one episode + a tuple per turn
            assert {t for m in memories for t in m.source_turn_ids} == {t.turn_id for t in session.turns}
        else:
            assert error in record.curation_error, record.curation_error
            assert memories == []
            # The LLM recovers: retrying the failed session curates it, nothing else changes.
            server.respond = scripted([GOOD])
            retry = memory.curate_pending(retry_failed=True)
            assert (retry.curated, retry.failed) == (1, 0)
            record = memory.store.sessions.get("alice", session.session_id)
            assert record.curation_status == "curated" and record.session == session
            assert len(memory.list("alice")) == 1 + len(session.turns)
    assert_integrity(db)


def test_retries_carry_the_validation_error_back_to_the_model(tmp_path, hashing_embedder, server, session):
    server.respond = scripted(['{"episodes": [{"title": "Ann', GOOD])
    with _open(tmp_path / "m.db", server, hashing_embedder) as memory:
        memory.ingest([session])
    first, retry = server.requests
    assert retry["messages"][: len(first["messages"])] == first["messages"]
    assert retry["messages"][-2] == {"role": "assistant", "content": '{"episodes": [{"title": "Ann'}
    assert "does not match CurationReply" in retry["messages"][-1]["content"]


def test_a_server_that_goes_away_after_start_is_a_clear_error_and_a_rerun_stores_the_session(
    tmp_path, hashing_embedder, server, session
):
    db = tmp_path / "m.db"
    with _open(db, server, hashing_embedder) as memory:
        assert memory.llm.model_id  # built (and the served model checked) while the server is up
        server.stop()
        with pytest.raises(LLMError, match=f"cannot count tokens with http://127.0.0.1:{server.port}/tokenize"):
            memory.ingest([session])
        assert memory.store.counts() == {"sessions": 0, "turns": 0}
    replacement = ChatServer(scripted([GOOD]), key=window_key)
    try:
        with _open(db, replacement, hashing_embedder) as memory:
            assert memory.ingest([session]).curated == 1
            assert memory.store.sessions.get("alice", session.session_id).session == session
    finally:
        replacement.stop()
    assert_integrity(db)


def test_an_unreachable_server_is_a_clear_error_before_anything_is_stored(tmp_path, hashing_embedder, server, session):
    server.stop()
    db = tmp_path / "m.db"
    with _open(db, server, hashing_embedder) as memory:
        with pytest.raises(LLMError, match="cannot reach the OpenAI-compatible server"):
            memory.ingest([session])
        assert memory.store.counts() == {"sessions": 0, "turns": 0}
    assert_integrity(db)


def test_the_cli_reports_an_unreachable_llm_server_in_one_line(tmp_path, server, session):
    server.stop()
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({"llm": {"backend": "openai-server", "model": "qwen3-8b", "base_url": server.base_url}})
    )
    sessions = write_jsonl([session], tmp_path / "s.jsonl")
    result = CliRunner().invoke(app, ["ingest", str(sessions), "--db", str(tmp_path / "m.db"), "--config", str(config)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert "cannot reach" in result.output


def test_memories_written_without_content_are_left_out_and_counted(tmp_path, hashing_embedder, server, session, caplog):
    """A small model copying turn ids into a tuple's fields: that tuple is left out, the rest is stored."""
    import json

    def with_an_empty_tuple(body: dict, attempt: int) -> str:
        reply = json.loads(curation_reply(body))
        first = turn_lines(body)[0][0]
        reply["tuples"].append(
            {
                "entity": first,
                "relation": first,
                "object": first,
                "timestamp": "2023-05-08",
                "context": "",
                "source_turn_ids": [first],
            }
        )
        return json.dumps(reply)

    server.respond = with_an_empty_tuple
    with _open(tmp_path / "m.db", server, hashing_embedder) as memory, caplog.at_level(logging.INFO):
        report = memory.ingest([session])
        assert (report.curated, report.memories, report.memories_left_out) == (1, 1 + len(session.turns), 1)
        stored = memory.list("alice")
        assert len(stored) == 1 + len(session.turns)
        assert not any(m.kind == "tuple" and m.entity == session.turns[0].turn_id for m in stored)

    # A check at work, not a fault: logged for --verbose with its reason, counted in the CLI's summary.
    [left_out] = [r for r in caplog.records if "memories left out" in r.getMessage()]
    assert left_out.levelno == logging.INFO and f"tuple '{session.turns[0].turn_id}'" in left_out.getMessage()
    overrides = {"embedder.backend": "hashing", **server.overrides(**OVERRIDES)}
    sessions = write_jsonl([session], tmp_path / "s.jsonl")
    settings = [f"--set={key}={value}" for key, value in overrides.items()]
    result = CliRunner().invoke(app, ["ingest", str(sessions), "--db", str(tmp_path / "cli.db"), *settings])
    assert result.exit_code == 0, result.output
    assert "with 5 memories" in result.output and "; 1 left out by the checks (-v lists them)" in result.output
