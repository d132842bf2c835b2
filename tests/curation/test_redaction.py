"""Forget requests in conversations (issue #25 item 3): the rules that find them, the plan of
what they name, and the redaction in a real store: search no longer returns the content, the
turns carry the marker, an admin can undo it exactly or confirm it (then the bytes are gone).
The rules redact as a session is stored (issue #33), before any curation; curation adds the
LLM's requests without redacting a turn twice.

``EchoLLM`` (tests/factories.py) stands in for the curation model: its memories repeat each turn's text (so they hold
what the user later asks to forget), and it marks the forget requests it is told to.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hybridmem_local.config import load_config
from hybridmem_local.curation.redaction import (
    REDACTION_MARKER,
    ForgetRequest,
    TurnText,
    detect_in_text,
    merge_requests,
    plan_redaction,
)
from hybridmem_local.errors import ConflictError, NotFoundError
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import Episode, RelationalTuple, Session, Turn
from tests.factories import EchoLLM

START = datetime(2024, 3, 4, 9, 0, tzinfo=timezone.utc)
SSN = "123-45-6789"


def session(session_id: str, *turns: tuple[str, str], day: int = 0) -> Session:
    return Session(
        session_id=session_id,
        namespace="alice",
        started_at=START + timedelta(days=day),
        turns=[Turn(turn_id=f"{session_id}:{i}", speaker=s, text=t) for i, (s, t) in enumerate(turns)],
    )


STATES_SSN = session(
    "s1",
    ("user", f"For the tax form: my social security number is {SSN}."),
    ("assistant", f"Got it, I noted {SSN} for the form."),
    ("user", "Also, my dog Biscuit turns five next week."),
)
ASKS_TO_FORGET = session("s2", ("user", "Please forget my social security number."), ("assistant", "Sure."), day=1)


def open_memory(path: Path, embedder, llm: EchoLLM | None = None, **overrides) -> HybridMemory:
    config = load_config(None, {"consolidation.every_n_sessions": 0, **overrides})
    return HybridMemory.open(path, config, embedder=embedder, llm=llm or EchoLLM())


def everything_found(memory: HybridMemory, query: str) -> str:
    """Every text a search returns (windows, episodes, tuples) and every active memory."""
    result = memory.search(query, namespace="alice", k=50)
    texts = [hit.window.index_text() for hit in result.windows] + [m.index_text() for m in result.memories()]
    texts += [m.index_text() for m in memory.list("alice")]
    return "\n".join(texts)


def store_files(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("Please forget my social security number.", "my social security number"),
        ("Can you delete what I said about my brother's debt from your memory?", "my brother's debt"),
        ("My PIN is 4321. Actually, forget that.", "that"),
        ("Don't remember my address, please.", "my address"),
        ("I shouldn't have told you my salary.", "my salary"),
        ("Remove my email from your memory please", "my email"),
        ("please don't keep my phone number", "my phone number"),
        ("Could you erase everything I told you about the surgery?", "the surgery"),
        ("My PIN is 4321, forget that.", "that"),
        ("I'd rather you didn't hold on to my home address.", "my home address"),
        ("Keep my passport number out of your notes, it's private.", "my passport number"),
    ],
)
def test_the_rules_find_requests_and_what_they_name(text, what):
    assert detect_in_text(text) == [what]


@pytest.mark.parametrize(
    "text",
    [
        "I forgot my keys at work.",
        "Don't forget the milk!",
        "She forgets names all the time.",
        "Oh forget it, let's talk about the game.",
        "I forget my password all the time.",
        "I need to delete my old photos to free space.",
        "We should remove the old carpet.",
        "Remember to erase the whiteboard before you leave.",
        # LoCoMo dev turns the first rules took for requests
        "Thanks, Maria. Got it. It's easy to get lost and forget that.",
        "I can relax, forget my troubles, and get lost in another world.",
    ],
)
def test_the_rules_ignore_mere_mentions_of_forgetting(text):
    assert detect_in_text(text) == []


def test_one_request_naming_two_things_is_two_requests():
    text = "Please forget my credit card number 4111 1111 1111 1111 and my email jo@example.com."
    assert detect_in_text(text) == ["my credit card number 4111 1111 1111 1111", "my email jo@example.com"]


def test_a_value_is_found_after_its_name_and_removed_whatever_its_separators():
    turns = [
        TurnText("a:0", "a", "user", f"My social security number is {SSN}, and I live in Leeds."),
        TurnText("b:0", "b", "user", "Please forget my social security number."),
    ]
    fact = RelationalTuple(
        id=7, namespace="alice", entity="user", relation="has SSN", object="123 45 6789", timestamp="2024-03-04"
    )
    other = RelationalTuple(
        id=8, namespace="alice", entity="user", relation="lives in", object="Leeds", timestamp="2024-03-04"
    )
    plan = plan_redaction([ForgetRequest(what="my social security number", turn_id="b:0")], turns, [fact, other])
    assert plan.turns == {"a:0": f"My social security number is {REDACTION_MARKER}, and I live in Leeds."}
    assert plan.rewritten == {7: {"entity": "user", "relation": "has SSN", "object": REDACTION_MARKER}}
    assert plan.deleted == [] and plan.values == [SSN]


def test_that_removes_the_sentences_before_the_request_or_the_previous_turn():
    turns = [
        TurnText("a:0", "a", "user", "My PIN is 4321. Actually, forget that."),
        TurnText("a:1", "a", "user", "I have three sisters."),
        TurnText("a:2", "a", "assistant", "Nice."),
        TurnText("a:3", "a", "user", "I shouldn't have told you that."),
    ]
    first = plan_redaction([ForgetRequest(what="that", turn_id="a:0")], turns, [])
    assert first.turns == {"a:0": f"{REDACTION_MARKER} Actually, forget that."}
    second = plan_redaction([ForgetRequest(what="that", turn_id="a:3")], turns, [])
    assert second.turns == {"a:1": REDACTION_MARKER}


def test_a_topic_removes_its_sentences_and_the_memories_about_it():
    turns = [
        TurnText("a:0", "a", "user", "My brother owes the bank money for his debt. The weather was fine."),
        TurnText("b:0", "b", "user", "Forget what I said about my brother's debt."),
    ]
    about = Episode(
        id=3,
        namespace="alice",
        title="Debt",
        summary="The user's brother has a debt.",
        details="The brother owes the bank.",
        timestamp="2024-03-04",
    )
    # Found on the default LLM's memories: a paraphrase without the topic's words, citing the turn.
    paraphrase = RelationalTuple(
        id=4,
        namespace="alice",
        entity="Tom",
        relation="owes",
        object="the bank money",
        timestamp="2024-03-04",
        source_turn_ids=["a:0"],
    )
    weather = RelationalTuple(
        id=5,
        namespace="alice",
        entity="weather",
        relation="was",
        object="fine",
        timestamp="2024-03-04",
        source_turn_ids=["a:0"],
    )
    plan = plan_redaction([ForgetRequest(what="my brother's debt", turn_id="b:0")], turns, [about, paraphrase, weather])
    assert plan.turns == {"a:0": f"{REDACTION_MARKER} The weather was fine."}
    assert plan.deleted == [3, 4]


# --------------------------------------------------------------------------- in the store


def test_a_request_redacts_turns_memories_and_indexes_and_undo_restores_exactly(tmp_path, hashing_embedder):
    db = tmp_path / "memory.db"
    with open_memory(db, hashing_embedder) as memory:
        memory.ingest([STATES_SSN])
        assert SSN in everything_found(memory, "social security number")
        memory.ingest([ASKS_TO_FORGET])

        found = everything_found(memory, "social security number tax form")
        assert "6789" not in found and REDACTION_MARKER in found
        turns = memory.get_session("alice", "s1").session.turns
        assert turns[0].text == f"For the tax form: my social security number is {REDACTION_MARKER}."
        assert turns[1].text == f"Got it, I noted {REDACTION_MARKER} for the form."
        assert turns[2].text == STATES_SSN.turns[2].text
        [redaction] = memory.redactions("alice")
        assert redaction.status == "pending" and redaction.undoable and redaction.turn_ids == ["s1:0", "s1:1"]
        assert redaction.requests[0]["what"] == "my social security number"
        events = memory.store.execute(
            "SELECT after FROM events WHERE action = 'redact' AND memory_id IS NULL"
        ).fetchall()
        assert len(events) == 1 and SSN not in events[0][0]
        assert all(SSN not in m.index_text() for m in memory.list("alice"))

        undone = memory.undo_redaction(redaction.id, namespace="alice")
        assert undone.status == "undone" and not undone.undoable
        assert memory.get_session("alice", "s1").session.turns == STATES_SSN.turns
        assert SSN in everything_found(memory, "social security number tax form")
        with pytest.raises(ConflictError):
            memory.undo_redaction(redaction.id)
        with pytest.raises(ConflictError):
            memory.confirm_redaction(redaction.id)


def test_confirm_leaves_no_byte_of_the_removed_value_in_the_store_folder(tmp_path, hashing_embedder):
    db = tmp_path / "memory.db"
    with open_memory(db, hashing_embedder) as memory:
        memory.ingest([STATES_SSN, ASKS_TO_FORGET])
        [redaction] = memory.redactions("alice", status="pending")
        assert SSN.encode() in store_files(db)  # kept for undo until confirmed
        confirmed = memory.confirm_redaction(redaction.id, namespace="alice")
        assert confirmed.status == "confirmed" and not confirmed.undoable
        memory.flush()
        assert SSN.encode() not in store_files(db)
        # The number in any separator form; a bare b"6789" also turns up by chance in the files'
        # audit hashes (hex) and microsecond timestamps, a few runs in a hundred.
        assert re.search(rb"123\D{0,3}45\D{0,3}6789", store_files(db)) is None
        assert "6789" not in everything_found(memory, "social security number")
        assert "Biscuit" in everything_found(memory, "dog Biscuit")  # the rest stays
        with pytest.raises(NotFoundError):
            memory.confirm_redaction(redaction.id, namespace="bob")


def test_redactions_pending_past_the_review_days_are_confirmed_by_the_next_curation(tmp_path, hashing_embedder):
    with open_memory(tmp_path / "memory.db", hashing_embedder, **{"curation.redaction_review_days": 0}) as memory:
        memory.ingest([STATES_SSN, ASKS_TO_FORGET])
        [redaction] = memory.redactions("alice")
        assert redaction.status == "confirmed"


def test_a_request_only_the_llm_marks_counts_with_rules_plus_llm_only(tmp_path, hashing_embedder):
    told = session("s1", ("user", "My email is dana@example.org."), ("assistant", "Noted."))
    indirect = session("s2", ("user", "My email is private, so it should not stay in your notes."), day=1)
    marks = {"s2:0": "my email"}
    with open_memory(tmp_path / "a.db", hashing_embedder, EchoLLM(marks)) as memory:
        memory.ingest([told, indirect])
        [redaction] = memory.redactions("alice")
        assert redaction.requests == [{"what": "my email", "turn_id": "s2:0", "detected_by": "llm"}]
        assert "dana@example.org" not in everything_found(memory, "email")
    rules_only = {"curation.forget_requests": "rules"}
    with open_memory(tmp_path / "b.db", hashing_embedder, EchoLLM(marks), **rules_only) as memory:
        memory.ingest([told, indirect])
        assert memory.redactions("alice") == []


def test_a_session_that_only_mentions_forgetting_changes_nothing(tmp_path, hashing_embedder):
    chat = session("s1", ("user", f"My SSN is {SSN}. I forgot my keys again, don't forget the milk."))
    with open_memory(tmp_path / "memory.db", hashing_embedder) as memory:
        memory.ingest([chat])
        assert memory.redactions("alice") == []
        assert memory.get_session("alice", "s1").session.turns == chat.turns


# --------------------------------------------------------------------------- as a session is stored

ASKED = "Please forget my social security number."


def redact_events(memory: HybridMemory) -> list[str]:
    rows = memory.store.execute(
        "SELECT action FROM events WHERE action IN ('redact', 'forget_request') ORDER BY id"
    ).fetchall()
    return [row[0] for row in rows]


@pytest.mark.parametrize(
    "store",
    [
        pytest.param(lambda m: (m.enqueue([STATES_SSN]), m.enqueue([ASKS_TO_FORGET])), id="enqueue"),
        pytest.param(lambda m: m.enqueue([STATES_SSN, ASKS_TO_FORGET]), id="one-enqueue"),
        pytest.param(lambda m: (m.enqueue([STATES_SSN]), m.remember("alice", ASKED)), id="remember"),
        pytest.param(lambda m: m.ingest([STATES_SSN, ASKS_TO_FORGET], curate=False), id="ingest-uncurated"),
    ],
)
def test_a_request_is_redacted_as_it_is_stored_whatever_the_curation_backlog(memory, store):
    store(memory)
    found = everything_found(memory, "social security number tax form")
    assert "6789" not in found and REDACTION_MARKER in found  # the windows serve the redacted turns
    [redaction] = memory.redactions("alice")
    assert redaction.status == "pending" and redaction.undoable and redaction.turn_ids == ["s1:0", "s1:1"]
    assert redaction.requests[0]["what"] == "my social security number"
    assert {r.curation_status for r in memory.store.sessions.select("alice")} == {"pending"}
    assert redact_events(memory) == ["redact"]


def test_enqueue_returns_the_sessions_as_stored(memory):
    told = session("s1", ("user", "My PIN is 4321. Actually, forget that."), ("assistant", "Done."))
    [record] = memory.enqueue([told])
    assert record.session.turns[0].text == memory.get_session("alice", "s1").session.turns[0].text
    assert "4321" not in record.session.turns[0].text and REDACTION_MARKER in record.session.turns[0].text


def test_ingest_with_curation_redacts_before_the_llm_sees_the_turns(tmp_path, hashing_embedder):
    with open_memory(tmp_path / "memory.db", hashing_embedder) as memory:
        report = memory.ingest([STATES_SSN, ASKS_TO_FORGET])
        assert report.stored == 2 and report.curated == 2
        # The stand-in's memories repeat the turns it is shown: none ever held the number.
        assert all("6789" not in m.index_text() for m in memory.list("alice", status=None))
        assert "6789" not in everything_found(memory, "social security number tax form")
        [redaction] = memory.redactions("alice")
        assert redaction.turn_ids == ["s1:0", "s1:1"] and redaction.rewritten == {}
        assert redact_events(memory) == ["redact"]


def test_curation_does_not_redact_again_what_storing_redacted(tmp_path, hashing_embedder):
    llm = EchoLLM({"s2:0": "my social security number"})  # the LLM marks the rules' turn too
    with open_memory(tmp_path / "memory.db", hashing_embedder, llm, **{"curation.mode": "queue"}) as memory:
        memory.enqueue([STATES_SSN, ASKS_TO_FORGET])
        assert memory.curate_pending().curated == 2
        [redaction] = memory.redactions("alice")
        assert redaction.requests == [{"what": "my social security number", "turn_id": "s2:0", "detected_by": "rules"}]
        assert redact_events(memory) == ["redact"]
        assert all("6789" not in m.index_text() for m in memory.list("alice", status=None))


def test_curation_leaves_a_redaction_an_admin_undid_undone(tmp_path, hashing_embedder):
    with open_memory(tmp_path / "memory.db", hashing_embedder, **{"curation.mode": "queue"}) as memory:
        memory.enqueue([STATES_SSN, ASKS_TO_FORGET])
        [redaction] = memory.redactions("alice")
        memory.undo_redaction(redaction.id)
        memory.curate_pending()
        assert [r.status for r in memory.redactions("alice")] == ["undone"]
        assert SSN in everything_found(memory, "social security number tax form")


def test_forget_requests_off_stores_the_turns_as_they_are(tmp_path, hashing_embedder):
    with open_memory(tmp_path / "memory.db", hashing_embedder, **{"curation.forget_requests": "off"}) as memory:
        memory.enqueue([STATES_SSN, ASKS_TO_FORGET])
        memory.ingest([session("s3", ("user", "My PIN is 4321. Actually, forget that."), day=2)])
        assert memory.redactions("alice") == [] and redact_events(memory) == []
        assert memory.get_session("alice", "s1").session.turns == STATES_SSN.turns
        assert "4321" in everything_found(memory, "PIN")


# --------------------------------------------------------------------------- the surfaces


def test_the_client_lists_undoes_and_confirms_redactions_over_http(tmp_path, hashing_embedder):
    from hybridmem_local.service.client import HybridMemoryClient
    from tests.service.http_harness import live_service

    db = tmp_path / "memory.db"
    with open_memory(db, hashing_embedder) as memory:
        memory.ingest([STATES_SSN, ASKS_TO_FORGET])
        memory.ingest([session("s3", ("user", "My email is dana@example.org. Please forget that."), day=2)])
    with (
        live_service(db, hashing_embedder, EchoLLM(), start_worker=False, require_auth=False) as service,
        HybridMemoryClient(service.url) as client,
    ):
        first, second = client.redactions("alice", status="pending")
        assert client.undo_redaction(first.id, namespace="alice").status == "undone"
        assert client.confirm_redaction(second.id, namespace="alice").status == "confirmed"
        assert [r.status for r in client.redactions("alice")] == ["undone", "confirmed"]
        with pytest.raises(ConflictError):
            client.confirm_redaction(first.id, namespace="alice")
        with pytest.raises(NotFoundError):
            client.undo_redaction(first.id, namespace="bob")
        assert SSN in client.search("social security number", namespace="alice", k=20).model_dump_json()
        assert "dana@example.org" not in client.search("email", namespace="alice", k=20).model_dump_json()


def test_a_request_remembered_over_http_is_not_served_while_curation_waits(tmp_path, hashing_embedder):
    from hybridmem_local.service.client import HybridMemoryClient
    from tests.service.http_harness import live_service

    with (
        live_service(
            tmp_path / "memory.db", hashing_embedder, EchoLLM(), start_worker=False, require_auth=False
        ) as service,
        HybridMemoryClient(service.url) as client,
    ):
        client.enqueue([STATES_SSN])
        assert SSN in client.search("social security number", namespace="alice", k=20).model_dump_json()
        client.remember("alice", ASKED)
        served = client.search("social security number", namespace="alice", k=20)
        # The texts served (the JSON's scores and timestamps may hold "6789" by chance).
        texts = [hit.window.index_text() for hit in served.windows] + [m.index_text() for m in served.memories()]
        assert texts and not any("6789" in text for text in texts)
        [redaction] = client.redactions("alice", status="pending")
        assert redaction.turn_ids == ["s1:0", "s1:1"]
        assert client.get_session("alice", "s1").curation_status == "pending"


def test_the_cli_lists_undoes_and_confirms_redactions(tmp_path, hashing_embedder, hashing_cli):
    from typer.testing import CliRunner

    from hybridmem_local.cli.main import app

    db = tmp_path / "memory.db"
    with open_memory(db, hashing_embedder) as memory:
        memory.ingest([STATES_SSN, ASKS_TO_FORGET])
    runner = CliRunner()
    listed = runner.invoke(app, ["redactions", "list", "-n", "alice", "--db", str(db), "--json"])
    assert listed.exit_code == 0, listed.output
    [redaction] = json.loads(listed.output)
    assert redaction["status"] == "pending" and SSN not in listed.output
    undone = runner.invoke(app, ["redactions", "undo", str(redaction["id"]), "--db", str(db), "--json"])
    assert undone.exit_code == 0 and json.loads(undone.output)["status"] == "undone", undone.output
    again = runner.invoke(app, ["redactions", "confirm", str(redaction["id"]), "--db", str(db)])
    assert again.exit_code != 0 and "undone already" in again.output


def test_the_llms_marks_add_requests_on_other_turns_and_confirm_the_rules_on_the_same():
    rules = [ForgetRequest(what="my email", turn_id="s1:0")]
    llm = [
        ForgetRequest(what="email", turn_id="s1:0", detected_by="llm"),
        ForgetRequest(what="my address", turn_id="s1:3", detected_by="llm"),
    ]
    assert [(r.what, r.turn_id, r.detected_by) for r in merge_requests(rules, llm)] == [
        ("my email", "s1:0", "both"),
        ("my address", "s1:3", "llm"),
    ]
