"""The CLI is the API with flags: the record verbs (add, add-memories, get, get-session, list,
update, delete, history), ``--json`` beside tables, ``--set`` config overrides and ``-`` for
standard input, the options every command shares declared once, run with typer's runner on a
real store (SQLite, hnswlib, BM25, the hashing embedder)."""

from __future__ import annotations

import json

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from hybridmem_local.cli.common import Output, StoreOptions, parse_overrides, with_options
from hybridmem_local.cli.main import app
from hybridmem_local.memory import HybridMemory
from hybridmem_local.schema import EpisodeDraft, Session, TupleDraft, Turn
from tests.conftest import HASHING_CONFIG

SESSION = Session(
    session_id="s1",
    namespace="alice",
    started_at="2023-05-08T13:56:00+00:00",
    turns=[
        Turn(turn_id="s1:0", speaker="Alice", text="I adopted a beagle puppy called Biscuit."),
        Turn(turn_id="s1:1", speaker="Bob", text="I ran the Riverside 10K in 52 minutes."),
        Turn(turn_id="s1:2", speaker="Alice", text="We moved to an apartment on Oak Avenue."),
    ],
)


def another_session(session_id: str, namespace: str = "alice") -> Session:
    """SESSION again under another id, with turn ids of its own (turn ids are unique per namespace)."""
    turns = [t.model_copy(update={"turn_id": t.turn_id.replace("s1", session_id)}) for t in SESSION.turns]
    return SESSION.model_copy(update={"session_id": session_id, "namespace": namespace, "turns": turns})


def run(*args: str, input: str | None = None, ok: bool = True):
    result = CliRunner().invoke(app, list(args), input=input)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def as_json(*args: str, input: str | None = None):
    return json.loads(run(*args, "--json", input=input).stdout)


@pytest.fixture
def db(tmp_path, hashing_embedder, hashing_cli):
    """A store with one session of alice's, two episodes and a tuple citing its turns; the
    commands open it with the same (hashing) embedder."""
    path = tmp_path / "memory.db"
    with HybridMemory.open(path, embedder=hashing_embedder) as memory:
        memory.add_memories(
            "alice",
            episodes=[
                EpisodeDraft(
                    title="Biscuit",
                    summary="A puppy",
                    details="Alice adopted a beagle puppy called Biscuit.",
                    timestamp="2023-05-08",
                    source_turn_ids=["s1:0"],
                ),
                EpisodeDraft(
                    title="Moving house",
                    summary="A new home",
                    details="Alice moved to Oak Avenue.",
                    timestamp="2023-05-08",
                    source_turn_ids=["s1:2"],
                ),
            ],
            tuples=[
                TupleDraft(
                    entity="Bob",
                    relation="ran",
                    object="the Riverside 10K in 52 minutes",
                    timestamp="2023-05-07",
                    source_turn_ids=["s1:1"],
                )
            ],
            session=SESSION,
        )
    return str(path)


def test_list_and_get_print_tables_or_json(db):
    listed = as_json("list", "-n", "alice", "--db", db)
    assert [(m["kind"], m["status"]) for m in listed] == [
        ("episode", "active"),
        ("episode", "active"),
        ("tuple", "active"),
    ]
    assert as_json("list", "-n", "alice", "--kind", "tuple", "--db", db) == [listed[2]]
    assert as_json("list", "-n", "alice", "--limit", "1", "--offset", "1", "--db", db) == [listed[1]]
    episode = as_json("get", str(listed[0]["id"]), "--db", db)
    assert episode == listed[0] and episode["source_turn_ids"] == ["s1:0"]
    table = run("list", "-n", "alice", "--db", db).stdout
    assert "Biscuit" in table and "s1:1" in table and "{" not in table


def test_update_supersedes_and_history_shows_it(db):
    [_, _, fact] = as_json("list", "-n", "alice", "--db", db)
    new = as_json(
        "update", str(fact["id"]), "--object", "the Riverside 10K in 51 minutes", "--reason", "typo", "--db", db
    )
    assert new["object"] == "the Riverside 10K in 51 minutes" and new["id"] != fact["id"] and new["status"] == "active"
    old = as_json("get", str(fact["id"]), "--db", db)
    assert old["status"] == "superseded" and old["superseded_by"] == new["id"]
    assert as_json("history", str(fact["id"]), "--db", db)[-1]["reason"] == "typo"
    [update] = as_json("history", str(new["id"]), "--db", db)
    assert update["action"] == "update" and update["before"]["object"] == fact["object"]
    found = as_json("search", "How fast was Bob's 10K?", "-n", "alice", "--kind", "tuple", "--db", db)
    assert [hit["memory"]["id"] for hit in found["tuples"]] == [new["id"]]


def test_delete_keeps_the_memory_in_history_and_out_of_the_active_list(db):
    [episode, *others] = as_json("list", "-n", "alice", "--db", db)
    deleted = as_json("delete", str(episode["id"]), "--reason", "wrong", "--db", db)
    assert deleted["status"] == "deleted"
    assert as_json("list", "-n", "alice", "--db", db) == others
    assert [m["id"] for m in as_json("list", "-n", "alice", "--status", "deleted", "--db", db)] == [episode["id"]]
    assert len(as_json("list", "-n", "alice", "--status", "any", "--db", db)) == 3
    assert as_json("history", str(episode["id"]), "--db", db)[-1]["reason"] == "wrong"


def test_set_overrides_the_config_of_any_command(db):
    assert len(as_json("search", "Biscuit the puppy", "-n", "alice", "--db", db)["episodes"]) == 2
    one = as_json("search", "Biscuit the puppy", "-n", "alice", "--set", "retrieval.k=1", "--db", db)
    assert len(one["episodes"]) == 1 and one["episodes"][0]["memory"]["title"] == "Biscuit"
    bad = run("list", "-n", "alice", "--set", "retrieval.k=0", "--db", db, ok=False)
    assert bad.exit_code == 1 and "retrieval.k" in bad.output


def test_config_and_files_are_read_from_stdin(db, tmp_path):
    assert (
        len(
            as_json(
                "search",
                "Biscuit",
                "-n",
                "alice",
                "--config",
                "-",
                "--db",
                db,
                input=HASHING_CONFIG + "retrieval:\n  k: 1\n",
            )["episodes"]
        )
        == 1
    )
    exported = tmp_path / "alice.jsonl"
    run("export", str(exported), "-n", "alice", "--db", db)
    assert as_json("import", "-", "-n", "copy", "--db", db, input=exported.read_text()) == {
        "sessions": 1,
        "memories": 3,
    }
    assert len(as_json("list", "-n", "copy", "--db", db)) == 3
    jsonl = another_session("s2", "bob").model_dump_json() + "\n"
    report = as_json("ingest", "-", "--no-curate", "--db", db, input=jsonl)
    assert (report["stored"], report["skipped"]) == (1, 0)
    assert as_json("stats", "-n", "bob", "--db", db)["counts"]["sessions"] == 1


def test_search_shows_the_windows_of_raw_turns_in_a_table_of_their_own(db, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich wraps cells to the terminal's width
    query = "How fast did Bob run the Riverside 10K?"
    found = as_json("search", query, "-n", "alice", "--db", db)
    assert found["tuples"] and found["windows"]
    table = run("search", query, "-n", "alice", "--db", db).stdout
    assert "memories" in table and "the Riverside 10K in 52 minutes (2023-05-07)" in table
    assert "conversation windows" in table
    for hit in found["windows"]:
        window = hit["window"]
        row = next(line for line in table.splitlines() if ",".join(t["turn_id"] for t in window["turns"]) in line)
        first = window["turns"][0]
        assert f"{hit['score']:.3f}" in row and "s1" in row and "2023-05-08 13:56" in row
        assert f"{first['speaker']}: {first['text']}" in row
    # A session stored without curation has no memories yet: its turns are the answer.
    jsonl = another_session("s9", "carol").model_dump_json() + "\n"
    run("ingest", "-", "--no-curate", "--db", db, input=jsonl)
    raw = as_json("search", query, "-n", "carol", "--db", db)
    assert raw["episodes"] == raw["tuples"] == [] and raw["windows"]
    assert raw["windows"][0]["window"]["turns"][1]["text"] == "I ran the Riverside 10K in 52 minutes."
    table = run("search", query, "-n", "carol", "--db", db).stdout
    assert "memories" not in table and "conversation windows" in table
    assert "Bob: I ran the Riverside 10K in 52 minutes." in table and "s9:0,s9:1,s9:2" in table
    assert len([line for line in table.splitlines() if "s9:" in line]) == len(raw["windows"])
    nothing = run("search", query, "-n", "nobody", "--db", db).stdout
    assert "memories" in nothing and "conversation windows" not in nothing


def test_add_queues_a_session_and_reports_what_it_stored(db):
    jsonl = another_session("s3").model_dump_json() + "\n"
    [result] = as_json("add", "-", "--set", "curation.mode=queue", "--db", db, input=jsonl)
    assert result["session"]["session"]["session_id"] == "s3" and result["session"]["curation_status"] == "pending"
    assert result["memories"] == [] and result["report"]["stored"] == 1
    [again] = as_json("add", "-", "--set", "curation.mode=queue", "--db", db, input=jsonl)
    assert again["report"]["skipped"] == 1


def test_user_mistakes_are_one_line_errors(tmp_path):
    db = str(tmp_path / "m.db")
    missing = run("get", "404", "--db", db, ok=False)
    assert missing.exit_code == 1 and "404" in missing.output
    empty = run("update", "1", "--db", db, ok=False)
    assert empty.exit_code == 1 and "nothing to update" in empty.output
    assert run("search", "x", "--since", "May 1st", "--db", db, ok=False).exit_code == 2
    assert run("ingest", "-", "--no-curate", "--db", db, input="{oops\n", ok=False).exit_code == 1


def test_the_demo_names_the_install_command_before_loading_anything(tmp_path, hashing_cli, monkeypatch):
    """No default LLM installed (an empty models dir; no wheel ships it): the demo stops with
    the command that installs it, before it opens a store or loads a model."""
    monkeypatch.setenv("HYBRIDMEM_MODELS_DIR", str(tmp_path / "no-models"))
    opened = []
    monkeypatch.setattr(HybridMemory, "open", lambda *args, **kwargs: opened.append(args))
    db = tmp_path / "demo" / "memory.db"
    refused = run("demo", "--db", str(db), ok=False)
    assert refused.exit_code == 1, refused.output
    assert "the demo needs models that are not installed; nothing was loaded" in refused.output
    assert "hybridmem models install qwen2.5-coder-1.5b-instruct" in refused.output
    assert opened == [] and not db.parent.exists()


def test_overrides_are_read_as_yaml_values():
    assert parse_overrides(["retrieval.k=5", "llm.backend=transformers", "curation.annotate_relative_dates=false"]) == {
        "retrieval.k": 5,
        "llm.backend": "transformers",
        "curation.annotate_relative_dates": False,
    }
    with pytest.raises(Exception, match="KEY=VALUE"):
        parse_overrides(["retrieval.k"])


def test_add_memories_reads_json_or_jsonl_and_checks_every_record_first(db, tmp_path):
    episode = {
        "title": "Oak Avenue",
        "summary": "A new flat",
        "details": "Alice's flat on Oak Avenue has a garden.",
        "timestamp": "2023-05-08",
        "source_turn_ids": ["s1:2"],
    }
    fact = {"entity": "Alice", "relation": "lives on", "object": "Oak Avenue", "timestamp": "2023-05-08"}
    added = as_json(
        "add-memories", "-", "-n", "alice", "--db", db, input=json.dumps({"episodes": [episode], "tuples": [fact]})
    )
    assert [(m["kind"], m["status"]) for m in added] == [("episode", "active"), ("tuple", "active")]
    assert added[0]["source_turn_ids"] == ["s1:2"] and added[1]["object"] == "Oak Avenue"
    jsonl = tmp_path / "memories.jsonl"
    jsonl.write_text(json.dumps(fact | {"object": "Elm Street"}) + "\n\n" + json.dumps(episode) + "\n")
    assert [m["kind"] for m in as_json("add-memories", str(jsonl), "-n", "alice", "--db", db)] == ["episode", "tuple"]
    assert len(as_json("list", "-n", "alice", "--db", db)) == 7
    # A bad record (line 2), or a turn the namespace does not have: nothing is stored.
    bad = run(
        "add-memories", "-", "-n", "alice", "--db", db, input=json.dumps(fact) + "\n" + '{"title": "x"}\n', ok=False
    )
    assert bad.exit_code == 1 and "line 2 (episode)" in bad.output
    unknown = json.dumps(episode | {"source_turn_ids": ["s9:0"]})
    refused = run("add-memories", "-", "-n", "alice", "--db", db, input=unknown, ok=False)
    assert refused.exit_code == 1 and "s9:0" in refused.output
    assert len(as_json("list", "-n", "alice", "--db", db)) == 7


def test_sessions_are_added_from_text_or_messages_and_read_back(db, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    stored = as_json("get-session", "s1", "-n", "alice", "--db", db)
    assert stored["curation_status"] == "curated" and [t["turn_id"] for t in stored["session"]["turns"]] == [
        "s1:0",
        "s1:1",
        "s1:2",
    ]
    table = run("get-session", "s1", "-n", "alice", "--db", db).stdout
    assert "session s1 (alice" in table and "curated" in table and "Bob" in table and "s1:1" in table
    note = as_json("remember", "My sister is called Dana.", "-n", "alice", "--db", db)
    assert note["curation_status"] == "pending" and note["session"]["turns"][0]["text"] == "My sister is called Dana."
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}]))
    record = as_json("add-messages", str(chat), "-n", "alice", "--session-id", "chat-1", "--db", db)
    assert record["session"]["session_id"] == "chat-1" and len(record["session"]["turns"]) == 2
    assert as_json("get-session", "chat-1", "-n", "alice", "--db", db) == record
    missing = run("get-session", "nope", "-n", "alice", "--db", db, ok=False)
    assert missing.exit_code == 1 and "nope" in missing.output
    chat.write_text(json.dumps([{"role": "user"}]))
    bad = run("add-messages", str(chat), "-n", "alice", "--db", db, ok=False)
    assert bad.exit_code == 1 and "message 1" in bad.output


def test_sessions_lists_by_status_and_backup_copies_the_store(db, tmp_path):
    as_json("remember", "My sister is called Dana.", "-n", "alice", "--db", db)
    listed = as_json("sessions", "-n", "alice", "--db", db)
    assert [r["curation_status"] for r in listed] == ["curated", "pending"]
    pending = as_json("sessions", "-n", "alice", "--status", "pending", "--db", db)
    assert [r["session"]["turns"][0]["text"] for r in pending] == ["My sister is called Dana."]
    assert as_json("sessions", "-n", "nobody", "--db", db) == []
    copy = tmp_path / "backup.db"
    copy.write_text("an older backup")  # replaced, not appended to
    assert as_json("backup", str(copy), "--db", db)["bytes"] == copy.stat().st_size
    assert (
        as_json("stats", "-n", "alice", "--db", copy)["counts"] == as_json("stats", "-n", "alice", "--db", db)["counts"]
    )
    assert as_json("search", "Biscuit the puppy", "-n", "alice", "--db", copy)["episodes"]  # indexes rebuilt


def test_rebuild_indexes_reports_each_index(db):
    reports = as_json("rebuild-indexes", "-n", "alice", "--db", db)
    assert reports and all(report["rebuilt"] for report in reports.values())
    assert len(as_json("search", "Biscuit the puppy", "-n", "alice", "--db", db)["episodes"]) == 2


def test_the_shared_options_are_declared_once_and_given_to_every_command():
    root = get_command(app)
    for name in ("get", "search", "add-memories", "rebuild-indexes"):
        options = {opt for param in root.commands[name].params for opt in param.opts}  # type: ignore[attr-defined]
        assert {"--db", "--config", "-c", "--set", "--json"} <= options, name

    def clash(db: int, *, store: StoreOptions, output: Output) -> None: ...

    with pytest.raises(TypeError, match="db"):
        with_options(clash)


def test_a_consolidation_report_is_a_table_of_its_stores_and_a_total():
    from hybridmem_local.cli.render import consolidation_table
    from hybridmem_local.results import ConsolidationReport, StoreReport

    report = ConsolidationReport(
        run_id=3,
        namespace="alice",
        backend="given",
        stores={"episode": StoreReport(memories_before=4, memories_after=2, merges=1), "tuple": StoreReport()},
    )
    table = consolidation_table(report)
    assert table.row_count == 3 and "run 3" in str(table.title) and "namespace alice" in str(table.title)
    assert list(table.columns[3].cells) == ["50.0%", "0.0%", "50.0%"]
