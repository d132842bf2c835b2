"""Reading session files and storing them: LoCoMo round trip, JSONL format errors."""

from __future__ import annotations

import json

import pytest

from hybridmem_local.errors import InputFileError
from hybridmem_local.eval.locomo import load_locomo
from hybridmem_local.files.session_files import read_sessions_file, read_sessions_jsonl
from hybridmem_local.memory import HybridMemory


def test_locomo_dev_file_round_trips_through_the_store(tmp_path, locomo_path):
    dataset = load_locomo(locomo_path)
    sessions = read_sessions_file(locomo_path, None)
    assert len(sessions) == sum(len(c.sessions) for c in dataset.conversations)
    with HybridMemory.open(tmp_path / "m.db") as memory:
        report = memory.ingest(sessions, curate=False)
        assert report.stored == len(sessions)
        assert memory.ingest(sessions, curate=False).skipped == len(sessions)  # idempotent
        for conversation in dataset.conversations:
            stored = [r.session for r in memory.store.sessions.select(conversation.sample_id)]
            assert stored == sorted(conversation.sessions, key=lambda s: s.started_at)
    raw = json.loads(locomo_path.read_text())
    first = raw[0]["conversation"]
    turn = first["session_1"][0]
    stored_turn = sessions[0].turns[0]
    assert (stored_turn.turn_id, stored_turn.speaker, stored_turn.text) == (
        turn["dia_id"],
        turn["speaker"],
        turn["text"],
    )


def test_locomo_namespace_and_conversation_selection(locomo_path):
    dataset = load_locomo(locomo_path)
    first, second = dataset.conversations[0].sample_id, dataset.conversations[1].sample_id
    one = read_sessions_file(locomo_path, "alice", [first])
    assert {s.namespace for s in one} == {"alice"}
    two = read_sessions_file(locomo_path, "team", [first, second])
    assert {s.namespace for s in two} == {f"team-{first}", f"team-{second}"}
    with pytest.raises(InputFileError, match="no conversation"):
        read_sessions_file(locomo_path, None, ["conv-nope"])


def _write(tmp_path, text: str | bytes):
    path = tmp_path / "s.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


GOOD = {
    "session_id": "s1",
    "started_at": "2023-05-08T13:56:00+00:00",
    "turns": [{"turn_id": "s1:0", "speaker": "A", "text": "hi"}],
}


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "no sessions found"),
        ("{not json\n", "line 1: invalid JSON"),
        ("[1, 2]\n", "expected a JSON object"),
        (json.dumps({**GOOD, "turns": []}), "line 1 (session 's1'): field turns"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "started_at"}), "field started_at"),
        (json.dumps({**GOOD, "started_at": "2023-05-08T13:56:00"}), "field started_at"),
        (json.dumps({**GOOD, "turns": [{"turn_id": "t", "speaker": "A", "text": 5}]}), "field turns.0.text"),
        (
            json.dumps({**GOOD, "turns": [{"turn_id": "t", "speaker": "A", "text": "x" * 1_000_001}]}),
            "field turns.0.text",
        ),
        (json.dumps({**GOOD, "namespace": "../etc"}), "invalid namespace"),
        (json.dumps(GOOD) + "\n" + json.dumps(GOOD), "line 2: session 's1' appears twice"),
        (json.dumps({**GOOD, "extra": 1}), "field extra"),
        (b'{"session_id": "s1", "x": "\xff\xfe"}\n', "line 1: not valid UTF-8"),
    ],
)
def test_malformed_session_files_name_line_and_field(tmp_path, content, message):
    with pytest.raises(InputFileError) as excinfo:
        read_sessions_jsonl(_write(tmp_path, content))
    assert message in str(excinfo.value)
    assert str(tmp_path / "s.jsonl") in str(excinfo.value)


def test_bad_file_leaves_earlier_data_intact(tmp_path):
    good = _write(tmp_path, json.dumps(GOOD))
    with HybridMemory.open(tmp_path / "m.db") as memory:
        memory.ingest(read_sessions_jsonl(good), curate=False)
        bad = tmp_path / "bad.jsonl"
        bad.write_text(
            json.dumps({**GOOD, "session_id": "s2", "turns": [{"turn_id": "s2:0", "speaker": "A", "text": "ok"}]})
            + "\n{broken\n"
        )
        with pytest.raises(InputFileError):
            memory.ingest(read_sessions_jsonl(bad), curate=False)
        assert [r.session.session_id for r in memory.store.sessions.select()] == ["s1"]


def test_export_memory_record_without_id_is_rejected(tmp_path):
    """Imports map ``superseded_by`` through the exported ids, so a memory without one cannot be placed."""
    from hybridmem_local.files.session_files import read_export

    record = {"type": "memory", "kind": "tuple", "entity": "A", "relation": "likes", "object": "tea"}
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps({**record, "timestamp": "2023-05-01"}) + "\n")
    with pytest.raises(InputFileError, match=r"export.jsonl: line 1: a memory record needs its 'id'"):
        read_export(path)
    path.write_text(json.dumps({**record, "timestamp": "2023-05-01", "id": 7}) + "\n")
    assert [m.stored_id for m in read_export(path)[1]] == [7]
