"""Memory checkpoints: a store's memories written without its turns, and a store rebuilt from
them on a machine that has only the results folder (the slow end-to-end run is in test_runner)."""

from __future__ import annotations

import json
import logging

import pytest

from hybridmem_local.errors import DatasetError
from hybridmem_local.eval.checkpoints import read_checkpoint, rebuild_store, session_lines, write_checkpoint
from hybridmem_local.eval.shards import shard_folders, unfinished_shards
from hybridmem_local.memory import HybridMemory
from tests.factories import make_episode, make_session, make_tuple


def _memories(memory: HybridMemory) -> list[tuple]:
    """Each memory as content, status and the content of the memory that superseded it: what a
    rebuilt store must reproduce, whatever ids it gives them."""
    rows = memory.list("alice", status=None)
    by_id = {m.id: m.render() for m in rows}
    return [(m.kind, m.render(), m.status, m.source_turn_ids, by_id.get(m.superseded_by)) for m in rows]


def test_a_store_rebuilt_from_its_checkpoint_holds_its_memories_and_statuses_and_no_turn(tmp_path, hashing_embedder):
    first, second = make_session("alice", 1), make_session("alice", 2)
    checkpoint_file = tmp_path / "out" / "memories" / "alice.jsonl"
    with HybridMemory.open(tmp_path / "machine-a.db", embedder=hashing_embedder) as memory:
        memory.ingest([first, second], curate=False)
        ids = memory.add_memories(
            "alice",
            episodes=[make_episode("Move", "Alice moved to Oslo.", ["s1:0"])],
            tuples=[make_tuple("Alice", "lives in", "Oslo", ["s1:1"]), make_tuple("Alice", "owns", "a kayak")],
            source_session_id="s1",
        )
        memory.update(ids[1], object="Bergen")  # a new memory supersedes the tuple
        memory.delete(ids[2], reason="outdated")
        write_checkpoint(memory, "alice", checkpoint_file, key="k1", base={"memories": 4})
        before = _memories(memory)
    written = checkpoint_file.read_text()
    assert not any(turn.text in written for turn in first.turns + second.turns)
    assert [p.name for p in checkpoint_file.parent.iterdir()] == ["alice.jsonl"]  # no partial file left

    # Another machine: the sessions stored again from the data (all pending), then rebuilt.
    rebuilt_path = tmp_path / "machine-b.db"
    with HybridMemory.open(rebuilt_path, embedder=hashing_embedder) as fresh:
        fresh.ingest([first, second], curate=False)
        sessions = session_lines(fresh, "alice")
    checkpoint = read_checkpoint(checkpoint_file, key="k1")
    assert checkpoint is not None and checkpoint.header["base"] == {"memories": 4}
    counts = rebuild_store(
        rebuilt_path, lambda at: HybridMemory.open(at, embedder=hashing_embedder), sessions, checkpoint
    )
    assert counts == {"sessions": 2, "memories": 4}
    assert not (tmp_path / "machine-b.db.import.jsonl").exists()  # the staging file held the turns
    with HybridMemory.open(rebuilt_path, embedder=hashing_embedder) as rebuilt:
        assert _memories(rebuilt) == before
        assert [r.curation_status for r in rebuilt.sessions("alice")] == ["curated", "pending"]
        assert rebuilt.get_session("alice", "s2").session.turns == second.turns
        top = rebuilt.search("Where does Alice live?", namespace="alice").tuples[0]
        assert top.memory.render().startswith("Alice — lives in — Bergen")


def test_a_checkpoint_of_another_config_is_not_used_and_a_broken_one_is_named(tmp_path, hashing_embedder, caplog):
    path = tmp_path / "alice.jsonl"
    with HybridMemory.open(tmp_path / "m.db", embedder=hashing_embedder) as memory:
        memory.add_memories("alice", tuples=[make_tuple("Alice", "likes", "tea")], session=make_session("alice", 1))
        write_checkpoint(memory, "alice", path, key="k1")
    with caplog.at_level(logging.WARNING):
        assert read_checkpoint(path, key="k2") is None
    assert "another config or prompt" in caplog.text
    assert read_checkpoint(tmp_path / "absent.jsonl", key="k1") is None

    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, json.dumps({"type": "turn", "text": "?"})]) + "\n")
    with pytest.raises(DatasetError, match=rf"alice.jsonl: line {len(lines) + 1} "):
        read_checkpoint(path, key="k1")
    path.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(DatasetError, match="no checkpoint header"):
        read_checkpoint(path, key="k1")


def test_a_shard_without_its_summary_is_unfinished_and_out_of_the_study(tmp_path):
    for name, files in {"conv-26": ["summary.json", "predictions.jsonl"], "conv-44": ["predictions.jsonl"]}.items():
        folder = tmp_path / "shards" / name
        folder.mkdir(parents=True)
        for file in files:
            (folder / file).write_text("{}\n")
    assert [p.name for p in shard_folders(tmp_path)] == ["conv-26"]
    assert [p.name for p in unfinished_shards(tmp_path)] == ["conv-44"]
