"""Offline consolidation on a real store: SQLite, hnswlib, the hashing embedder (MiniLM where
the real clusterer groups near-duplicates by meaning).

The LLM is the one thing that cannot run usefully here (SmolLM2-135M writes no sensible plan),
so plans come from :class:`ScriptedLLM`: a real ``ChatBackend`` (validation, retries) whose
completions are hand-written plan JSON chosen by the memories a prompt shows. The main test
records those replies into the real ``CachedLLM`` with a dry run and replays them with a
backend that fails if called. Clusters are given directly for speed, except in the slow tests
that run the real CPU clusterer (UMAP's numba JIT costs ~20 s per process).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from hybridmem_local.cli.render import consolidation_table
from hybridmem_local.config import LLMConfig, load_config
from hybridmem_local.consolidation.planner import EpisodePlan, TuplePlan, plan_consolidation
from hybridmem_local.errors import ConsolidationError, NotFoundError
from hybridmem_local.llm.base import LLMRequest
from hybridmem_local.llm.cache import CachedLLM
from hybridmem_local.llm.replies import ChatBackend, Completion
from hybridmem_local.memory import HybridMemory
from hybridmem_local.results import ConsolidationReport
from hybridmem_local.schema import Episode, EpisodeDraft, MemoryStatus, RelationalTuple
from hybridmem_local.storage.embedding_cache import text_hash
from tests.factories import make_episode, make_session, make_tuple

NS = "alice"
REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- scripted LLM


def shown_memories(request: LLMRequest) -> list[dict]:
    """The memories the first user message shows, as the JSON objects the prompt lists."""
    user = next(m.content for m in request.messages if m.role == "user")
    return [json.loads(line) for line in user.splitlines() if line.startswith('{"id": "M')]


def ids_with(request: LLMRequest, needle: str) -> list[str]:
    return [m["id"] for m in shown_memories(request) if needle in json.dumps(m)]


class ScriptedLLM(ChatBackend):
    """Replies come from ``respond(request) -> str``; validation and retries are the real ones."""

    def __init__(self, respond: Callable[[LLMRequest], str], model_id: str = "scripted:consolidation"):
        super().__init__(LLMConfig(max_retries=0))
        self.model_id = model_id
        self.respond = respond
        self.batches: list[list[LLMRequest]] = []

    def _complete(self, requests):
        self.batches.append(list(requests))
        return [
            Completion(
                text=self.respond(r), prompt_tokens=self.count_tokens(r.messages[-1].content), completion_tokens=10
            )
            for r in requests
        ]

    def count_tokens(self, text: str) -> int:
        return len(text) // 4 + 1


class RefusingLLM(ScriptedLLM):
    """Stands behind a prefilled cache: any call reaching it is a test failure."""

    def __init__(self, model_id: str = "scripted:consolidation"):
        super().__init__(self._refuse, model_id)

    @staticmethod
    def _refuse(request):
        raise AssertionError("the LLM was called; every reply should have come from the cache")


def good_plan(request: LLMRequest) -> str:
    """The plan a sensible model would write for the planted groups (nothing for other groups)."""
    if ids_with(request, "Mount Tam"):
        return json.dumps(
            {
                "merges": [
                    {
                        "member_ids": ids_with(request, "Mount Tam"),
                        "merged": {
                            "title": "Mount Tam hike",
                            "summary": "Alice and Bob hiked Mount Tam.",
                            "details": "On Saturday Alice and Bob hiked Mount Tam in Alice's new boots and saw a "
                            "coyote near the summit.",
                            # Not a member's timestamp, and made-up provenance: both must be replaced.
                            "timestamp": "2023-06-30",
                            "source_turn_ids": ["made-up"],
                        },
                    }
                ],
                "deletions": [],
            }
        )
    if ids_with(request, "bakery in Oakland"):
        return json.dumps(
            {"merges": [], "deletions": [{"id": ids_with(request, "bakery in Oakland")[0], "reason": "outdated"}]}
        )
    if ids_with(request, "jazz"):
        return json.dumps(
            {
                "merges": [
                    {
                        "member_ids": ids_with(request, "jazz"),
                        "merged": {
                            "entity": "Alice",
                            "relation": "likes",
                            "object": "jazz music, especially live",
                            "timestamp": "2023-05-02",
                            "context": "Mentioned twice while planning weekends.",
                        },
                    }
                ],
                "deletions": [{"id": i, "reason": "outdated"} for i in ids_with(request, "Paris")],
            }
        )
    kind = "tuple" if '"entity"' in json.dumps(shown_memories(request)) else "episode"
    return (EpisodePlan if kind == "episode" else TuplePlan)(merges=[], deletions=[]).model_dump_json()


# --------------------------------------------------------------------------- planted store


@pytest.fixture
def planted(memory) -> dict[str, int]:
    """Three sessions of Alice's memories: near-duplicates, an outdated job, a move, fillers."""
    s1, s2, s3 = (make_session(NS, i) for i in (1, 2, 3))
    ids = {}
    names = ["hike1", "bakery", "cat", "paris", "jazz1", "tea"]
    ids.update(
        zip(
            names,
            memory.add_memories(
                NS,
                episodes=[
                    make_episode(
                        "Hiking trip", "Alice hiked Mount Tam with Bob on Saturday and saw a coyote.", ["s1:0"], day=3
                    ),
                    make_episode("Job", "Alice started a new job at a bakery in Oakland.", ["s1:1"], day=1),
                    make_episode("Cat", "Alice adopted a grey cat named Miso from a shelter.", ["s1:2"], day=2),
                ],
                tuples=[
                    make_tuple("Alice", "lives in", "Paris", ["s1:2"], day=1),
                    make_tuple("Alice", "likes", "jazz", ["s1:3"], day=2),
                    make_tuple("Bob", "drinks", "green tea every morning", ["s1:1"], day=2),
                ],
                session=s1,
            ),
            strict=True,
        )
    )
    names = ["hike2", "hike3", "jazz2"]
    ids.update(
        zip(
            names,
            memory.add_memories(
                NS,
                episodes=[
                    make_episode(
                        "Hiking trip",
                        "On Saturday Alice and Bob hiked Mount Tam; they spotted a coyote near the summit.",
                        ["s2:1"],
                        day=4,
                    ),
                    make_episode(
                        "Hike", "Alice went hiking on Mount Tam, wearing her new boots.", ["s2:2", "s2:1"], day=5
                    ),
                ],
                tuples=[make_tuple("Alice", "enjoys", "live jazz music", ["s2:0"], day=6)],
                session=s2,
            ),
            strict=True,
        )
    )
    names = ["library", "lyon"]
    ids.update(
        zip(
            names,
            memory.add_memories(
                NS,
                episodes=[
                    make_episode(
                        "New job", "Alice quit the bakery and now works at a library in Berkeley.", ["s3:0"], day=20
                    )
                ],
                tuples=[make_tuple("Alice", "lives in", "Lyon", ["s3:1"], day=15)],
                session=s3,
            ),
            strict=True,
        )
    )
    return ids


def planted_clusters(ids: dict[str, int]) -> dict[str, list[list[int]]]:
    return {
        "episode": [[ids["hike1"], ids["hike2"], ids["hike3"]], [ids["bakery"], ids["library"]]],
        "tuple": [[ids["paris"], ids["jazz1"], ids["jazz2"], ids["lyon"]]],
    }


#: The order ``rows`` lists each table in: its key (there is no rowid on PostgreSQL).
ORDER = {
    "memories": "id",
    "events": "id",
    "consolidation_runs": "id",
    "sessions": "id",
    "namespaces": "name",
    "embeddings": "namespace, model_id, text_hash",
}


def rows(memory: HybridMemory, table: str) -> list[dict]:
    return [dict(r._mapping) for r in memory.store.execute(f"SELECT * FROM {table} ORDER BY {ORDER[table]}")]


def snapshot(memory: HybridMemory) -> dict[str, list[dict]]:
    return {
        t: rows(memory, t) for t in ("memories", "events", "consolidation_runs", "namespaces", "sessions", "embeddings")
    }


QUERIES = ["Where did Alice hike?", "What music does Alice like?", "Where does Alice work?", "Where does Alice live?"]


def search_results(memory: HybridMemory) -> list[list[tuple[int, float]]]:
    return [
        [(h.memory.id, round(h.score, 5)) for h in [*r.episodes, *r.tuples]]
        for r in (memory.search(q, namespace=NS, k=3) for q in QUERIES)
    ]


# --------------------------------------------------------------------------- plan, apply


def test_dry_run_records_plan_and_real_run_replays_it_from_the_cache(memory, planted, tmp_path):
    before = snapshot(memory)
    cache_path = tmp_path / "llm_cache.sqlite"
    recorder = ScriptedLLM(good_plan)
    with CachedLLM(recorder, cache_path) as cached:
        dry = memory.consolidate(NS, llm=cached, clusters=planted_clusters(planted), dry_run=True)
    assert snapshot(memory) == before, "a dry run must not change the store"
    assert dry.run_id is None and dry.dry_run
    assert [len(b) for b in recorder.batches] == [3], "all groups go to the LLM in one batch"
    assert [(s.memories_before, s.memories_after) for s in dry.stores.values()] == [(6, 3), (5, 3)]
    assert sorted(len(g.group.memory_ids) for g in dry.plan.groups) == [2, 3, 4]

    with CachedLLM(RefusingLLM(), cache_path) as replay:
        report = memory.consolidate(NS, llm=replay, clusters=planted_clusters(planted))
    assert report.llm.requests == report.llm.cached == 3
    assert report.run_id is not None
    assert {k: (s.memories_before, s.memories_after, s.merges, s.deletions) for k, s in report.stores.items()} == {
        "episode": (6, 3, 1, 1),
        "tuple": (5, 3, 1, 1),
    }
    assert round(report.compression_pct, 2) == round(100 * 5 / 11, 2)
    counts = memory.store.counts(NS)
    assert (counts["episodes_active"], counts["tuples_active"]) == (3, 3)
    assert counts["episodes_superseded"] == 3 and counts["tuples_superseded"] == 2
    assert counts["episodes_deleted"] == counts["tuples_deleted"] == 1

    # The merged episode: provenance is the union of its sources', the timestamp the newest member's.
    (episode_id,) = [i for i, sources in report.merged.items() if planted["hike1"] in sources]
    merged = memory.get(episode_id)
    assert merged.status == MemoryStatus.active
    assert merged.source_turn_ids == ["s1:0", "s2:1", "s2:2"]
    assert merged.timestamp == "2023-05-05"
    assert merged.source_session_id is None  # members came from two sessions
    for name in ("hike1", "hike2", "hike3"):
        source = memory.get(planted[name])
        assert source.status == MemoryStatus.superseded and source.superseded_by == episode_id
    # The merged tuple keeps the LLM's timestamp: it is one of its members'.
    (tuple_id,) = [i for i, sources in report.merged.items() if planted["jazz1"] in sources]
    assert memory.get(tuple_id).timestamp == "2023-05-02"
    assert memory.get(tuple_id).source_turn_ids == ["s1:3", "s2:0"]
    assert memory.get(planted["paris"]).status == MemoryStatus.deleted
    assert memory.history(planted["paris"])[-1].reason == "outdated"
    assert report.deleted == {planted["bakery"]: "outdated", planted["paris"]: "outdated"}

    # History: every change is an event carrying the run id.
    events = memory.store.events.of_run(report.run_id)
    assert sorted(e.action for e in events) == ["deleted"] * 2 + ["merge"] * 2 + ["superseded"] * 5
    assert [e.action for e in memory.history(planted["hike2"])] == ["add", "superseded"]

    run = memory.store.execute("SELECT * FROM consolidation_runs WHERE id = :id", {"id": report.run_id}).fetchone()
    assert run.status == "applied" and run.backend == "given" and run.finished_at
    params = json.loads(run.params)
    assert params["consolidation"]["umap"]["n_neighbors"] == 10
    assert params["consolidation"]["hdbscan"]["min_cluster_size"] == 10
    stored = ConsolidationReport.model_validate_json(run.report)
    assert stored.merged == report.merged and stored.plan is None
    assert "Mount Tam" not in run.report, "the run row keeps ids, not memory text"
    assert (
        memory.store.scalar("SELECT sessions_since_consolidation FROM namespaces WHERE name = :name", {"name": NS}) == 0
    )

    # Search sees the merged rows, not their sources.
    hits = memory.search("Alice and Bob hiked Mount Tam and saw a coyote", namespace=NS, k=3)
    assert hits.episodes[0].memory.id == episode_id
    found = {m.id for m in memory.search("Mount Tam coyote jazz Paris bakery", namespace=NS, k=10).memories()}
    assert not found & {planted[n] for n in ("hike1", "hike2", "hike3", "jazz1", "jazz2", "paris", "bakery")}

    table = consolidation_table(report)
    assert table.row_count == 3 and "run" in str(table.title)


def test_a_plan_changes_nothing_until_the_facade_applies_it_and_stale_groups_are_skipped(memory, planted):
    before = snapshot(memory)
    report = plan_consolidation(
        memory.indexes, NS, ScriptedLLM(good_plan), memory.config, clusters=planted_clusters(planted)
    )
    assert snapshot(memory) == before, "planning writes nothing"
    assert report.dry_run and report.run_id is None and len(report.plan.groups) == 3
    assert (report.stores["episode"].merges, report.stores["tuple"].merges) == (1, 1)  # what applying would do
    # Another writer retires a member of the tuple group after planning: that group is skipped, not the run.
    memory.delete(planted["jazz1"], reason="changed meanwhile")
    applied = memory.apply_consolidation(report)
    assert not applied.dry_run and applied.run_id is not None
    assert planted["jazz1"] not in {i for sources in applied.merged.values() for i in sources}
    assert any("changed since planning" in s.error for s in applied.skipped)
    assert (applied.stores["episode"].merges, applied.stores["tuple"].merges) == (1, 0)
    (episode_id,) = applied.merged
    (merge_event,) = [e for e in memory.history(episode_id) if e.action == "merge"]
    assert (
        merge_event.run_id == applied.run_id and merge_event.before is None
    )  # several sources: each has its own event
    assert memory.get(planted["jazz2"]).status == MemoryStatus.active


def test_undo_restores_exact_rows_and_search_results(memory, planted):
    before_rows = rows(memory, "memories")
    before_search = search_results(memory)
    report = memory.consolidate(NS, llm=ScriptedLLM(good_plan), clusters=planted_clusters(planted))
    assert search_results(memory) != before_search

    result = memory.undo(report.run_id)
    assert (result.restored, result.removed) == (7, 2)
    after_rows = {r["id"]: r for r in rows(memory, "memories")}
    assert [after_rows[r["id"]] for r in before_rows] == before_rows
    for merged_id in report.merged:
        assert after_rows[merged_id]["status"] == "deleted"
        assert after_rows[merged_id]["status_reason"] == f"undo of run {report.run_id}"
    assert search_results(memory) == before_search
    # A fresh process (indexes caught up from disk and SQLite) sees the same.
    memory.flush()
    with HybridMemory.open(memory.store.path, embedder=memory.embedder) as reopened:
        assert search_results(reopened) == before_search

    assert [e.action for e in memory.history(planted["hike1"])] == ["add", "superseded", "undo"]
    assert [e.action for e in memory.store.events.of_run(report.run_id)].count("undo") == 9
    status = memory.store.scalar("SELECT status FROM consolidation_runs WHERE id = :id", {"id": report.run_id})
    assert status == "undone"
    with pytest.raises(ConsolidationError, match="already undone"):
        memory.undo(report.run_id)


def test_undo_is_refused_while_a_later_run_builds_on_the_same_memories(memory, planted):
    initial = rows(memory, "memories")
    first = memory.consolidate(
        NS, llm=ScriptedLLM(good_plan), clusters={"tuple": [[planted["jazz1"], planted["jazz2"]]]}
    )
    (jazz_merged,) = first.merged

    def merge_all(request):
        return json.dumps(
            {
                "merges": [
                    {
                        "member_ids": [m["id"] for m in shown_memories(request)],
                        "merged": {
                            "entity": "Alice",
                            "relation": "likes",
                            "object": "jazz and tea",
                            "timestamp": "2023-05-06",
                        },
                    }
                ],
                "deletions": [],
            }
        )

    second = memory.consolidate(NS, llm=ScriptedLLM(merge_all), clusters={"tuple": [[jazz_merged, planted["tea"]]]})
    with pytest.raises(ConsolidationError, match=rf"run {second.run_id}.*undo the later run"):
        memory.undo(first.run_id)
    assert memory.get(jazz_merged).status == MemoryStatus.superseded, "a refused undo changes nothing"

    memory.undo(second.run_id)
    memory.undo(first.run_id)
    restored = {r["id"]: r for r in rows(memory, "memories")}
    assert [restored[r["id"]] for r in initial] == initial


# --------------------------------------------------------------------------- invalid plans


#: A real reply: SmolLM2-135M-Instruct (transformers backend, constrained to EpisodePlan) for a
#: group of four LoCoMo observations. It merges M1 and deletes it too.
RECORDED_SMOLLM2_REPLY = (
    '{ "merges": [{"member_ids": ["M1", "M3"], "merged": {"title": "M1", "summary": "M1 attended an LGBTQ support '
    'group recently and found the transgender stories inspiring.", "details": "M1 attended an LGBTQ support group '
    'recently and found the transgender stories inspiring.", "timestamp": "2023-05-08" }}, { "member_ids": ["M2", '
    '"M4"], "merged": {"title": "M2", "summary": "M2 attended an LGBTQ support group recently and found the '
    'transgender stories inspiring.", "details": "M2 attended an LGBTQ support group recently and found the '
    'transgender stories inspiring.", "timestamp": "2023-05-08" '
    '}} ] ,"deletions": [{"id": "M1", "reason": "outdated"}]}'
)


def _bad_episode_plans(request):
    hikes = ids_with(request, "Mount Tam")
    merged = {"title": "t", "summary": "s", "details": "d", "timestamp": "2023-05-05"}
    return {
        "foreign id": (
            {"merges": [{"member_ids": [hikes[0], "M9"], "merged": merged}], "deletions": []},
            "not in this group",
        ),
        "duplicate id": (
            {
                "merges": [{"member_ids": hikes[:2], "merged": merged}],
                "deletions": [{"id": hikes[0], "reason": "duplicate"}],
            },
            "more than once",
        ),
        "wrong schema": (
            {"merges": [{"member_ids": hikes[:1], "merged": {"title": "t"}}]},
            "does not match EpisodePlan",
        ),
        "deletes everything": (
            {"merges": [], "deletions": [{"id": m["id"], "reason": "outdated"} for m in shown_memories(request)]},
            "deletes every memory",
        ),
        "recorded SmolLM2 reply": (json.loads(RECORDED_SMOLLM2_REPLY), "'M1' is used more than once"),
    }


@pytest.mark.parametrize(
    "case", ["foreign id", "duplicate id", "wrong schema", "deletes everything", "recorded SmolLM2 reply"]
)
def test_invalid_plans_are_retried_once_then_skipped_without_any_change(memory, planted, case):
    before = rows(memory, "memories")
    events_before = len(rows(memory, "events"))
    llm = ScriptedLLM(lambda request: json.dumps(_bad_episode_plans(request)[case][0]))
    group = [planted["hike1"], planted["hike2"], planted["hike3"], planted["bakery"]]
    report = memory.consolidate(NS, llm=llm, clusters={"episode": [group]})

    expected_error = _bad_episode_plans(llm.batches[0][0])[case][1]
    if case == "wrong schema":  # a failed reply: the LLM layer's own retries (max_retries) had their turn
        assert [len(b) for b in llm.batches] == [1]
    else:
        assert [len(b) for b in llm.batches] == [1, 1], "one retry, in its own batch"
        retry = llm.batches[1][0]
        assert retry.messages[-2].role == "assistant" and expected_error in retry.messages[-1].content
    (skipped,) = report.skipped
    assert expected_error in skipped.error
    assert report.stores["episode"].invalid_plans_skipped == 1
    assert report.stores["episode"].llm_calls == len(llm.batches)
    assert rows(memory, "memories") == before
    assert len(rows(memory, "events")) == events_before, "no memory event: the run recorded only itself"
    assert report.run_id is not None and not report.merged and not report.deleted


def test_a_plan_fixed_on_retry_is_applied_and_a_bad_group_does_not_block_others(memory, planted):
    replies = {"first": True}

    def respond(request):
        if ids_with(request, "Mount Tam") and replies.pop("first", False):
            return json.dumps(
                {
                    "merges": [
                        {
                            "member_ids": ["M1", "M1"],
                            "merged": {"title": "t", "summary": "s", "details": "d", "timestamp": "2023-05-05"},
                        }
                    ],
                    "deletions": [],
                }
            )
        if ids_with(request, "bakery in Oakland"):
            return json.dumps({"merges": [], "deletions": [{"id": "M7", "reason": "outdated"}]})
        return good_plan(request)

    llm = ScriptedLLM(respond)
    report = memory.consolidate(NS, llm=llm, clusters=planted_clusters(planted))
    assert [len(b) for b in llm.batches] == [3, 2]
    assert [g.attempts for g in report.plan.groups] == [2, 1]
    assert report.stores["episode"].merges == 1 and report.stores["episode"].invalid_plans_skipped == 1
    assert memory.get(planted["bakery"]).status == MemoryStatus.active
    assert memory.get(planted["library"]).status == MemoryStatus.active
    assert report.stores["tuple"].memories_after == 3


def test_clusters_that_do_not_fit_the_context_are_split(tmp_path, hashing_embedder):
    config = load_config(overrides={"llm.context_tokens": 700, "llm.max_new_tokens": 64})
    with HybridMemory.open(tmp_path / "m.db", config=config, embedder=hashing_embedder) as memory:
        ids = memory.add_memories(
            NS, tuples=[make_tuple("Alice", "visited", f"museum number {i} in Rome", day=1 + i % 28) for i in range(40)]
        )
        llm = ScriptedLLM(good_plan)
        report = memory.consolidate(NS, llm=llm, clusters={"tuple": [ids]})
    (batch,) = llm.batches
    assert len(batch) > 2 and report.llm.requests == len(batch)
    budget = 700 - 64
    for request in batch:
        assert sum(llm.count_tokens(m.content) for m in request.messages) <= budget
    shown = [m["object"] for r in batch for m in shown_memories(r)]
    assert len(shown) == len(set(shown)) >= 39, "every memory in one group (a lone leftover may be dropped)"


def test_bad_clusters_argument_names_the_problem(memory, planted):
    with pytest.raises(ValueError, match=r"clusters\['tuple'\]\[0\]: memory .* is not an active tuple"):
        memory.consolidate(NS, llm=RefusingLLM(), clusters={"tuple": [[planted["hike1"], planted["paris"]]]})
    with pytest.raises(ValueError, match="more than one cluster"):
        memory.consolidate(
            NS,
            llm=RefusingLLM(),
            clusters={"tuple": [[planted["paris"], planted["lyon"]], [planted["paris"], planted["tea"]]]},
        )
    with pytest.raises(NotFoundError, match="does not exist"):
        memory.consolidate("nobody", llm=RefusingLLM(), clusters={})


# --------------------------------------------------------------------------- scheduling, purge


def test_maybe_consolidate_waits_for_enough_sessions(memory, planted):
    assert memory.config.consolidation.every_n_sessions == 10
    assert memory.consolidate_if_due(NS, llm=RefusingLLM()) is None, "3 sessions < 10"
    memory.config.consolidation.every_n_sessions = 0
    assert memory.consolidate_if_due(NS, llm=RefusingLLM()) is None, "0 means never"
    assert memory.consolidate_if_due("nobody", llm=RefusingLLM()) is None

    # Due: 3 sessions. 6 episodes and 5 tuples are too few for UMAP with 10 neighbours, so the
    # run clusters nothing and asks the LLM nothing, but it is recorded and resets the counter.
    memory.config.consolidation.every_n_sessions = 3
    report = memory.consolidate_if_due(NS, llm=RefusingLLM())
    assert report is not None and report.run_id is not None and report.llm.requests == 0
    assert "clustering needs at least" in report.stores["episode"].clustering_skipped
    counter = memory.store.scalar(
        "SELECT sessions_since_consolidation FROM namespaces WHERE name = :name", {"name": NS}
    )
    assert counter == 0
    assert memory.consolidate_if_due(NS, llm=RefusingLLM()) is None


def test_purge_removes_old_non_active_rows_their_vectors_and_history(memory, planted):
    report = memory.consolidate(NS, llm=ScriptedLLM(good_plan), clusters=planted_clusters(planted))
    assert memory.purge(NS, older_than=timedelta(days=1)).memories == 0

    gone = sorted({i for sources in report.merged.values() for i in sources} | set(report.deleted))
    gone_texts = {text_hash(m.index_text()) for m in memory.store.memories.get_many(gone).values()}
    active_before = search_results(memory)
    result = memory.purge(NS, older_than=timedelta(0))
    assert result.memories == len(gone) == 7 and result.kept_referenced == 0
    assert memory.store.memories.get_many(gone) == {}
    assert all(memory.store.events.history(i) == [] for i in gone)
    hashes = {
        r.text_hash
        for r in memory.store.execute(
            "SELECT text_hash FROM embeddings WHERE namespace = :namespace", {"namespace": NS}
        )
    }
    assert not hashes & gone_texts
    assert result.embeddings == len(gone_texts)
    purge_event = memory.store.scalar("SELECT after FROM events WHERE action = 'purge'")
    assert json.loads(purge_event)["memory_ids"] == gone
    assert search_results(memory) == active_before
    with pytest.raises(ConsolidationError, match="purged"):
        memory.undo(report.run_id)


# --------------------------------------------------------------------------- crash safety

CHILD_STEP_SLEEP_S = 0.05


def _child(db: str, cache: str, clusters: str, model_id: str, dim: str) -> None:
    """Apply the cached plan in a fresh process, printing a line after every status change."""
    from hybridmem_local.storage.memories import Memories

    original = Memories.set_status

    def set_status_then_pause(self, *args, **kwargs):
        original(self, *args, **kwargs)
        print("step", flush=True)
        time.sleep(CHILD_STEP_SLEEP_S)

    Memories.set_status = set_status_then_pause
    with (
        HybridMemory.open(db, embedder=CacheOnlyEmbedder(model_id, int(dim))) as memory,
        CachedLLM(RefusingLLM(), Path(cache)) as llm,
    ):
        print("ready", flush=True)
        memory.consolidate(NS, llm=llm, clusters=json.loads(clusters))
        print("done", flush=True)


class CacheOnlyEmbedder:
    """The child's embedder: every vector it needs was cached by the parent's embedder, so this
    proves the apply re-embeds nothing."""

    def __init__(self, model_id: str, dimension: int):
        self.model_id, self.dimension = model_id, dimension

    def embed(self, texts):
        raise AssertionError(f"consolidation tried to embed {len(texts)} texts")


def _logical_dump(path: Path) -> dict:
    """Rows without wall-clock columns, so a run in another process compares equal."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    memories = [
        {k: v for k, v in zip(r.keys(), r, strict=True) if k != "created_at"}
        for r in conn.execute("SELECT * FROM memories ORDER BY id")
    ]
    events = [
        (r["action"], r["memory_id"], r["run_id"], r["reason"])
        for r in conn.execute("SELECT * FROM events ORDER BY id")
    ]
    runs = [(r["id"], r["status"], r["backend"]) for r in conn.execute("SELECT * FROM consolidation_runs ORDER BY id")]
    counter = conn.execute("SELECT sessions_since_consolidation FROM namespaces").fetchall()
    ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
    conn.close()
    return {
        "memories": memories,
        "events": events,
        "runs": runs,
        "counter": [tuple(r) for r in counter],
        "integrity": ok,
    }


def _copy_db(source: Path, target: Path) -> None:
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    src.backup(dst)
    src.close()
    dst.close()


@pytest.mark.slow
def test_sigkill_during_apply_leaves_the_store_before_or_after_never_between(memory, planted, tmp_path):
    clusters = planted_clusters(planted)
    embedder = memory.embedder
    cache = tmp_path / "llm_cache.sqlite"
    with CachedLLM(ScriptedLLM(good_plan), cache) as recorder:
        dry = memory.consolidate(NS, llm=recorder, clusters=clusters, dry_run=True)
    # Cache the merged records' vectors as a real run would, so children never embed.
    merged = [
        (Episode if isinstance(m.merged, EpisodeDraft) else RelationalTuple)(**m.merged.model_dump())
        for g in dry.plan.groups
        for m in g.merges
    ]
    memory.indexes.embed(NS, [m.index_text() for m in merged])
    pristine = tmp_path / "pristine.db"
    _copy_db(memory.store.path, pristine)
    before = _logical_dump(pristine)
    reference = tmp_path / "reference.db"
    _copy_db(pristine, reference)
    with (
        HybridMemory.open(reference, embedder=CacheOnlyEmbedder(embedder.model_id, embedder.dimension)) as ref,
        CachedLLM(RefusingLLM(), cache) as llm,
    ):
        ref.consolidate(NS, llm=llm, clusters=clusters)
    after = _logical_dump(reference)
    assert after != before
    steps = sum(len(m.source_ids) for g in dry.plan.groups for m in g.merges) + sum(
        len(g.deletions) for g in dry.plan.groups
    )

    outcomes = []
    run_s = 0.0  # how long a child takes from "ready" to exit, measured by the unkilled run
    # Seed 0 is not killed: the child's own run must land exactly on the reference. Seeds 1-7
    # are killed right after a random status change (inside the transaction); seeds 8-10 at
    # a random moment up to the run's duration (before, during or after the transaction).
    for seed in range(11):
        rng = random.Random(seed)
        db = tmp_path / f"run{seed}.db"
        _copy_db(pristine, db)
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.consolidation.test_consolidation",
                str(db),
                str(cache),
                json.dumps(clusters),
                embedder.model_id,
                str(embedder.dimension),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        if seed == 0:
            started = time.perf_counter()
            child.wait(timeout=60)
            run_s = time.perf_counter() - started
            assert child.returncode == 0, child.stderr.read()
            mode = "complete"
        elif seed <= 7:
            kill_after = rng.randint(1, steps)
            for _ in range(kill_after):
                assert child.stdout.readline().strip() == "step", child.stderr.read()
            os.kill(child.pid, signal.SIGKILL)
            mode = f"after step {kill_after}/{steps}"
        else:
            time.sleep(rng.uniform(0, run_s))
            os.kill(child.pid, signal.SIGKILL)
            mode = "random delay"
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
        state = _logical_dump(db)
        assert state["integrity"] == "ok"
        assert state in (before, after), f"seed {seed} ({mode}): the store is neither before nor after the run"
        outcomes.append((mode, "before" if state == before else "after"))
    assert outcomes[0] == ("complete", "after")
    assert any(o == "before" for m, o in outcomes if m.startswith("after step")), outcomes


# --------------------------------------------------------------------------- real clustering


@pytest.mark.slow
def test_real_clusterer_groups_planted_near_duplicates_and_maybe_consolidate_merges_them(tmp_path, minilm):
    from hybridmem_local.consolidation.clustering import CPUClusterer

    topics = {
        "Biscuit": [
            "Alice has a golden retriever named Biscuit.",
            "Biscuit is Alice's golden retriever.",
            "Alice owns a dog called Biscuit, a golden retriever.",
            "Alice's dog Biscuit is a golden retriever.",
            "Alice adopted a golden retriever and named him Biscuit.",
            "The golden retriever Alice owns is named Biscuit.",
        ],
        "Lisbon": [
            "Alice is moving to Lisbon next spring for a new job.",
            "Alice will relocate to Lisbon in spring for work.",
            "Next spring Alice moves to Lisbon because of a job offer.",
            "Alice got a job in Lisbon and moves there next spring.",
            "Alice plans to move to Lisbon next spring for work.",
            "Alice accepted a position in Lisbon, moving in spring.",
        ],
        "peanut": [
            "Alice is allergic to peanuts.",
            "Alice has a peanut allergy.",
            "Eating peanuts gives Alice an allergic reaction.",
            "Alice cannot eat peanuts because of an allergy.",
            "Alice avoids peanuts due to her allergy.",
            "Alice said she is allergic to peanuts.",
        ],
    }
    rng = random.Random(7)
    subjects = ["Bob", "Carol", "Dan", "Erin", "Frank", "Grace", "Heidi", "Ivan"]
    things = [
        "a violin",
        "the stock market",
        "quantum physics",
        "a sailing boat",
        "Roman history",
        "sourdough bread",
        "a chess club",
        "mountain biking",
        "a jazz record",
        "tax forms",
        "a vegetable garden",
        "an old camera",
    ]
    filler = [f"{rng.choice(subjects)} talked about {thing} on day {i}." for i, thing in enumerate(things * 3)]
    config = load_config(
        overrides={
            "consolidation.every_n_sessions": 2,
            "consolidation.hdbscan.min_cluster_size": 5,
            "consolidation.backend": "cpu",
        }
    )

    def merge_planted(request):
        for needle in topics:
            members = ids_with(request, needle)
            if len(members) >= 2:
                return json.dumps(
                    {
                        "merges": [
                            {
                                "member_ids": members,
                                "merged": {
                                    "title": needle,
                                    "summary": needle,
                                    "details": topics[needle][0],
                                    "timestamp": "2023-05-01",
                                },
                            }
                        ],
                        "deletions": [],
                    }
                )
        return EpisodePlan(merges=[], deletions=[]).model_dump_json()

    with HybridMemory.open(tmp_path / "m.db", config=config, embedder=minilm) as memory:
        texts = [t for group in topics.values() for t in group] + filler
        rng.shuffle(texts)
        ids = memory.add_memories(
            NS,
            episodes=[make_episode(f"note {i}", text, day=1 + i % 28) for i, text in enumerate(texts)],
            session=make_session(NS, 1),
        )
        id_of = dict(zip(texts, ids, strict=True))
        clusterer = CPUClusterer(config.consolidation)
        assert memory.consolidate_if_due(NS, llm=RefusingLLM(), clusterer=clusterer) is None, "1 session < 2"
        memory.ingest([make_session(NS, 2)], curate=False)
        report = memory.consolidate_if_due(NS, llm=ScriptedLLM(merge_planted), clusterer=clusterer)
        assert report is not None and report.backend == "cpu"
        assert report.timings.umap_s > 0 and report.timings.hdbscan_s > 0 and report.timings.embed_load_s > 0
        assert report.stores["episode"].clusters >= 3
        # Every planted fact ends up as one merged memory holding all of its paraphrases.
        merged_sources = [set(s) for s in report.merged.values()]
        for needle, group in topics.items():
            ids = {id_of[text] for text in group}
            assert ids in merged_sources, f"{needle}: {ids} not merged as one ({merged_sources})"
        assert memory.store.counts(NS)["episodes_active"] == len(texts) - 18 + 3
        assert memory.consolidate_if_due(NS, llm=RefusingLLM(), clusterer=clusterer) is None, (
            "the run reset the counter"
        )


if __name__ == "__main__":
    _child(*sys.argv[1:])
