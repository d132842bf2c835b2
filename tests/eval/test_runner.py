"""The evaluation harness: systems, variants, reports, and whole runs on a LoCoMo conversation.

The fast tests cover what the runner decides by itself (which variants run, what full-context
keeps, which retrieved items count at k, how a summary is aggregated and drawn). The slow
tests run the real harness end to end on conv-26 of the LoCoMo dev file with the embedded
models (SmolLM2 through llama.cpp, MiniLM): curation, consolidation, answering, judging and
the report; then again from the cache alone; then retrieval only, without any LLM call.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from hybridmem_local.config import Config, load_config
from hybridmem_local.eval.metrics import wilson_interval
from hybridmem_local.eval.options import RunOptions, system_runs
from hybridmem_local.eval.render import render_markdown, write_report
from hybridmem_local.eval.report import answer_costs, build_summary
from hybridmem_local.eval.systems import (
    EvalConversation,
    EvalQuestion,
    FullContextSystem,
    SystemSettings,
    _interleave,
    retrieved_at,
    session_header,
)
from hybridmem_local.schema import Episode, Hit, RelationalTuple, SearchResult, turn_line
from tests.factories import make_session


def word_count(text: str) -> int:
    return len(text.split())


# --------------------------------------------------------------------------- variants


def test_k_and_mcs_sweeps_label_variants_and_keep_the_configs_own_values_plain(tmp_path):
    config = Config()
    options = RunOptions(
        benchmark="locomo", data=tmp_path / "x.json", out=tmp_path, systems=["hybrid", "rag"], ks=[5, 10], mcs=[2, 10]
    )
    runs = {run.label: run for run in system_runs(options, config)}
    # --mcs brings hybrid+consolidation in; rag has no k to sweep; k=10 and mcs=10 are the config's.
    assert sorted(runs) == sorted(
        [
            "hybrid@k5",
            "hybrid",
            "rag",
            "hybrid+consolidation@mcs2@k5",
            "hybrid+consolidation@mcs2",
            "hybrid+consolidation@k5",
            "hybrid+consolidation",
        ]
    )
    assert (runs["hybrid+consolidation@mcs2@k5"].k, runs["hybrid+consolidation@mcs2@k5"].mcs) == (5, 2)
    assert runs["rag"].k == config.retrieval.k and runs["rag"].mcs is None
    # Swept budgets are also reported as recall@k.
    assert {5, 10} <= set(options.recall_ks)


def test_options_reject_unknown_systems_and_sweeps_without_memory_systems(tmp_path):
    with pytest.raises(ValueError, match="unknown system"):
        RunOptions(benchmark="locomo", data=tmp_path, out=tmp_path, systems=["hybrid", "mem0"])
    with pytest.raises(ValueError, match="--k sweeps the memory systems"):
        RunOptions(benchmark="locomo", data=tmp_path, out=tmp_path, systems=["rag", "full-context"], ks=[2])
    with pytest.raises(ValueError, match="min_cluster_size"):
        RunOptions(benchmark="locomo", data=tmp_path, out=tmp_path, mcs=[1])


# --------------------------------------------------------------------------- full context


def _conversation(n_sessions: int = 4, n_turns: int = 5) -> EvalConversation:
    sessions = [make_session("ns", i, n_turns=n_turns) for i in range(n_sessions)]
    question = EvalQuestion(question_id="q", question="What topic?", gold="x", category="single-hop")
    return EvalConversation(conversation_id="c", namespace="ns", sessions=sessions, questions=[question])


def _full_context(conversation: EvalConversation, limit: int) -> FullContextSystem:
    settings = SystemSettings(config=Config(), count_tokens=word_count, context_limit=lambda q: limit, k=10)
    system = FullContextSystem(settings)
    system.prepare(conversation, memory=None)
    return system


def test_max_sessions_leaves_out_questions_about_later_sessions(locomo_path, tmp_path):
    from hybridmem_local.eval.benchmarks import load_benchmark

    whole = load_benchmark(_options(locomo_path, tmp_path, limit=None, max_sessions=None)).conversations[0]
    loaded = load_benchmark(_options(locomo_path, tmp_path, limit=None, max_sessions=2))
    [trimmed] = loaded.conversations
    stored = {t.turn_id for s in whole.sessions[:2] for t in s.turns}
    answerable = [q.question_id for q in whole.questions if set(q.evidence) <= stored]
    assert [q.question_id for q in trimmed.questions] == answerable
    assert 0 < len(answerable) < len(whole.questions)
    assert loaded.counts["questions_beyond_max_sessions"] == len(whole.questions) - len(answerable)
    # --limit then takes the first answerable questions, not the first of the file.
    limited = load_benchmark(_options(locomo_path, tmp_path, limit=2, max_sessions=2)).conversations[0]
    assert [q.question_id for q in limited.questions] == answerable[:2]


def test_full_context_shows_every_turn_under_session_dates_when_it_fits():
    conversation = _conversation()
    context = _full_context(conversation, limit=10_000).context(conversation.questions[0])
    all_turns = [t.turn_id for s in conversation.sessions for t in s.turns]
    assert context.turn_ids == all_turns
    assert not context.truncated
    assert context.text.count("### ") == len(conversation.sessions)
    assert context.tokens == word_count(context.text)


def test_full_context_keeps_the_most_recent_turns_that_fit():
    conversation = _conversation()
    whole = _full_context(conversation, limit=10_000).context(conversation.questions[0])
    limit = whole.tokens // 2
    context = _full_context(conversation, limit=limit).context(conversation.questions[0])
    all_turns = [t.turn_id for s in conversation.sessions for t in s.turns]
    kept = context.turn_ids
    assert context.truncated and context.tokens <= limit
    assert 0 < len(kept) < len(all_turns)
    assert kept == all_turns[-len(kept) :]  # a suffix: the newest turns, in order
    assert context.text.startswith(FullContextSystem.OMITTED)
    # The first kept turn's session still has its date header.
    first_session = next(s for s in conversation.sessions if kept[0] in {t.turn_id for t in s.turns})
    assert f"### {first_session.started_at:%Y-%m-%d}" in context.text
    # The next older turn would not have fitted (with its session's header when it starts one).
    turns = {t.turn_id: (s, t) for s in conversation.sessions for t in s.turns}
    previous_session, previous = turns[all_turns[len(all_turns) - len(kept) - 1]]
    extra = word_count(turn_line(previous))
    if previous_session is not first_session:
        extra += word_count(session_header(previous_session.started_at))
    assert context.tokens + extra > limit


# --------------------------------------------------------------------------- ranked items at k


def _search_result(n_episodes: int, n_tuples: int) -> SearchResult:
    episodes = [
        Hit(
            memory=Episode(
                id=i,
                namespace="ns",
                title=f"e{i}",
                summary="s",
                details=f"d{i}",
                timestamp="2023-05-01",
                source_turn_ids=[f"e{i}"],
            ),
            score=1 - i / 100,
        )
        for i in range(n_episodes)
    ]
    tuples = [
        Hit(
            memory=RelationalTuple(
                id=100 + i,
                namespace="ns",
                entity="A",
                relation="r",
                object=f"o{i}",
                timestamp="2023-05-01",
                source_turn_ids=[f"t{i}"],
            ),
            score=1 - i / 100,
        )
        for i in range(n_tuples)
    ]
    return SearchResult(query="q", namespace="ns", episodes=episodes, tuples=tuples)


def test_items_at_k_are_the_top_k_episodes_and_top_2k_tuples():
    result = _search_result(n_episodes=6, n_tuples=5)  # fewer tuples than 2 per episode
    ranked = _interleave(result, tuple_multiplier=2, shown_memories=set(), shown_turns=set())
    assert [i.id for i in ranked[:6]] == [0, 100, 101, 1, 102, 103]
    for k in (1, 2, 3, 6):
        top = retrieved_at(ranked, k, tuple_multiplier=2)
        assert sorted(t for i in top for t in i.turn_ids) == sorted(
            [f"e{i}" for i in range(min(k, 6))] + [f"t{i}" for i in range(min(2 * k, 5))]
        )


# --------------------------------------------------------------------------- summary and report


def _record(system: str, question_id: str, category: str, correct: bool | None, recall: bool, tokens: int) -> dict:
    return {
        "system": system,
        "system_name": system.split("@")[0],
        "question_id": question_id,
        "category": category,
        "context_tokens": tokens,
        "prompt_tokens": tokens + 100,
        "answer_s": 1.0,
        "retrieval_s": 0.01,
        "answer_error": None,
        "judge_error": None if correct is not None else "bad reply",
        "context_truncated": False,
        "metrics": {
            "judge_correct": correct,
            "f1_official": 0.5,
            "f1": 0.25,
            "bleu1": 0.1,
            "evidence_recall": recall,
            "evidence_recall@2": recall,
            "session_recall@2": None,
        },
    }


def test_summary_aggregates_per_system_and_category_and_draws_sweeps(tmp_path):
    records = []
    for system, accuracy in (
        ("hybrid", [True, True, False, None]),
        ("hybrid@k2", [True, False, False, False]),
        ("hybrid+consolidation@mcs5", [True, True, True, False]),
    ):
        for i, correct in enumerate(accuracy):
            records.append(_record(system, f"q{i}", ["single-hop", "temporal"][i % 2], correct, i < 2, 100 * (i + 1)))
    runs = [
        {"label": "hybrid", "system": "hybrid", "k": 10, "mcs": None},
        {"label": "hybrid@k2", "system": "hybrid", "k": 2, "mcs": None},
        {"label": "hybrid+consolidation@mcs5", "system": "hybrid+consolidation", "k": 10, "mcs": 5},
    ]
    summary = build_summary(
        records=records,
        runs=runs,
        benchmark="locomo",
        recall_ks=[2],
        retrieval_only=False,
        cost={"phases": {}, "invocations": 1},
        counts={"conversations": 1, "questions": 4, "sessions": 2},
        options={},
        consolidation={
            "mcs5": [
                {
                    "conversation_id": "c",
                    "mcs": 5,
                    "memories_before": 40,
                    "memories_after": 30,
                    "clusters": 3,
                    "llm_requests": 3,
                    "merges": 4,
                    "deletions": 2,
                }
            ]
        },
    )
    hybrid = summary["systems"]["hybrid"]
    judged = [
        r["metrics"]["judge_correct"]
        for r in records
        if r["system"] == "hybrid" and r["metrics"]["judge_correct"] is not None
    ]
    assert hybrid["overall"]["judge_accuracy"] == pytest.approx(sum(judged) / len(judged))
    assert hybrid["overall"]["n"] == 4 and hybrid["overall"]["judged"] == 3 and hybrid["overall"]["judge_failures"] == 1
    temporal = [r for r in records if r["system"] == "hybrid" and r["category"] == "temporal"]
    assert hybrid["by_category"]["temporal"]["context_tokens_mean"] == pytest.approx(
        sum(r["context_tokens"] for r in temporal) / len(temporal)
    )
    assert list(hybrid["by_category"]) == ["single-hop", "temporal"]  # the paper's column order
    assert hybrid["overall"]["session_recall@2"] is None  # LoCoMo has no answer sessions
    assert summary["consolidation"]["mcs5"]["compression_pct"] == pytest.approx(25.0)
    # Every rate metric carries its interval: Wilson's for right/wrong, the bootstrap for graded scores.
    assert hybrid["overall"]["ci95"]["judge_accuracy"] == pytest.approx(list(wilson_interval(2, 3)))
    assert hybrid["overall"]["ci95"]["f1"] == [0.25, 0.25]  # graded, the same on every question
    # One judged, right: not a certainty (the bootstrap would say 100–100).
    assert hybrid["by_category"]["temporal"]["ci95"]["judge_accuracy"] == pytest.approx([0.2065, 1.0], abs=1e-4)
    summary["judge_audit"] = {"judged": 8, "accepted": 2, "false_accept_rate": 0.25, "ci95": [0.0, 0.5]}

    written = {p.name for p in write_report(tmp_path, summary)}
    assert {
        "summary.json",
        "summary.md",
        "summary.csv",
        "scores_by_category.png",
        "recall_at_k.png",
        "k_sweep.png",
        "compression_vs_accuracy.png",
    } <= written
    with open(tmp_path / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["system"], r["category"]) for r in rows} == {
        (s, c) for s in summary["systems"] for c in ("overall", "single-hop", "temporal")
    }
    markdown = (tmp_path / "summary.md").read_text()
    assert "| category | hybrid | hybrid@k2 | hybrid+consolidation@mcs5 |" in markdown
    low, high = (100 * v for v in hybrid["overall"]["ci95"]["judge_accuracy"])
    assert f"| hybrid | 66.7 ({low:.1f}–{high:.1f}) |" in markdown
    assert "judge false-accept rate: 25.0% (0.0–50.0) of 8 planted wrong answers" in markdown
    # Paired per category on the questions both judged: single-hop q0 (both right) and q2 (only the
    # consolidated one), temporal q1 (both right; q3's hybrid verdict failed).
    assert "| system − baseline | single-hop | temporal |" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| hybrid+consolidation@mcs5 − hybrid | +"))
    single_hop, temporal = row.strip("| ").split(" | ")[1:]
    assert single_hop.startswith("+50.0 (") and single_hop.endswith("[2]")
    assert temporal == "+0.0 (+0.0 to +0.0) [1]"
    overall_row = next(r for r in rows if (r["system"], r["category"]) == ("hybrid", "overall"))
    assert float(overall_row["judge_accuracy_ci95_low"]) == pytest.approx(
        hybrid["overall"]["ci95"]["judge_accuracy"][0]
    )
    assert json.loads((tmp_path / "summary.json").read_text())["systems"]["hybrid@k2"]["k"] == 2
    # Means carry their bootstrap interval too (tokens vary by question here: 100 to 400).
    low, high = hybrid["overall"]["ci95"]["context_tokens_mean"]
    assert 100 <= low < hybrid["overall"]["context_tokens_mean"] < high <= 400
    assert float(overall_row["context_tokens_mean_ci95_high"]) == pytest.approx(high)


def _usage(system: str, requests: int, cached: int, wall_s: float, phase: str = "answering") -> dict:
    return {"phase": phase, "system": system, "requests": requests, "cached": cached, "wall_s": wall_s}


def test_seconds_per_answer_count_only_the_answers_the_model_made():
    rows = [
        _usage("hybrid", 20, 0, 600.0),  # a fresh run: 30 s per answer
        _usage("hybrid", 20, 14, 240.0),  # a resumed one: 6 answers made, 40 s each
        _usage("hybrid", 20, 20, 0.5),  # all cached: a lookup, no answer made
        _usage("hybrid", 20, 0, 90.0, phase="judging"),
        _usage("rag", 20, 0, 1000.0),
    ]
    costs = answer_costs(rows)
    assert costs["hybrid"]["runs"] == 2 and costs["hybrid"]["answers"] == 26
    assert costs["hybrid"]["s_per_answer"] == pytest.approx(840.0 / 26)
    low, high = costs["hybrid"]["ci95"]
    assert 30.0 <= low < high <= 40.0
    assert costs["rag"]["s_per_answer"] == pytest.approx(50.0) and costs["rag"]["ci95"] is None

    records = [_record(system, "q0", "single-hop", True, True, 100) for system in ("hybrid", "rag")]
    runs = [{"label": s, "system": s, "k": 10, "mcs": None} for s in ("hybrid", "rag")]
    summary = build_summary(
        records=records,
        runs=runs,
        benchmark="locomo",
        recall_ks=[2],
        retrieval_only=False,
        cost={"phases": {}, "answering": costs, "invocations": 3},
        counts={},
        options={},
        consolidation={},
    )
    markdown = render_markdown(summary)
    header = next(line for line in markdown.splitlines() if line.startswith("| system | LLM judge"))
    assert header.endswith("| s per answer |")
    assert next(line for line in markdown.splitlines() if line.startswith("| hybrid |")).endswith(
        f"| {840 / 26:.1f} ({low:.1f}–{high:.1f}) |"
    )
    assert next(line for line in markdown.splitlines() if line.startswith("| rag |")).endswith("| 50.0 |")


# --------------------------------------------------------------------------- end to end (slow)

E2E_SYSTEMS = "hybrid,hybrid+consolidation,full-context,rag"


@pytest.fixture(scope="module")
def e2e_config(tmp_path_factory) -> Path:
    """The plumbing model (SmolLM2 via llama.cpp, MiniLM on CPU), as a YAML file: these tests
    check the runner, not answers, so the fastest real model runs them."""
    if importlib.util.find_spec("llama_cpp") is None:  # not imported: the backend picks the build first
        pytest.skip("the embedded LLM needs llama-cpp-python (the 'cpu-llm' extra)")
    path = tmp_path_factory.mktemp("config") / "cpu.yaml"
    # Bounded SmolLM2 cost: replies of at most 384 tokens (a curation reply cut off there fails
    # and the run counts it), no re-asking; one llama.cpp thread, which stays fast when other
    # jobs share the cores.
    llm = {"model": "smollm2-135m-instruct", "max_new_tokens": 384, "max_retries": 0, "n_threads": 1}
    path.write_text(yaml.safe_dump({"embedder": {"device": "cpu"}, "llm": llm}))
    return path


def _cache_rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT count(*) FROM llm_calls").fetchone()[0]


def _options(locomo_path: Path, out: Path, **overrides) -> RunOptions:
    values = dict(
        benchmark="locomo",
        data=locomo_path,
        out=out,
        systems=E2E_SYSTEMS.split(","),
        conversations=["conv-26"],
        limit=3,
        max_sessions=1,
        batch_size=8,
    )
    return RunOptions(**{**values, **overrides})


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, e2e_config, locomo_path):
    """One real run through the CLI: ingest + curate 1 session, consolidate, 3 questions x 4 systems."""
    from typer.testing import CliRunner

    from hybridmem_local.cli.main import app

    out = tmp_path_factory.mktemp("eval") / "run"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "locomo",
            "--data",
            str(locomo_path),
            "--config",
            str(e2e_config),
            "--conversations",
            "conv-26",
            "--limit",
            "3",
            "--max-sessions",
            "1",
            "--systems",
            E2E_SYSTEMS,
            "--batch-size",
            "8",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_a_run_writes_predictions_summary_plots_and_manifest(first_run, e2e_config):
    out = first_run
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    systems = E2E_SYSTEMS.split(",")
    assert sorted((r["system"], r["question_id"]) for r in records) == sorted(
        (s, f"conv-26:qa{i}") for s in systems for i in range(3)
    )
    for record in records:
        assert record["gold"] and record["prediction"] is not None
        assert (record["verdict"] is None) == (record["judge_error"] is not None)
        assert record["prompt_tokens"] > record["context_tokens"] > 0
        assert (record["answer_mode"], record["evidence_turns"]) == ("text", True)  # the answering defaults
        if record["system"] != "full-context":
            # Evidence recall is read from the provenance of what was shown.
            shown = {t for item in record["retrieved"] if item["shown"] for t in item["turn_ids"]}
            assert record["metrics"]["evidence_recall"] == all(e in shown for e in record["evidence"])
    # Memory systems see what curation stored (SmolLM2's curation of a LoCoMo session may fail;
    # the run goes on and counts it).
    with sqlite3.connect(out / "stores" / "conv-26.db") as db:
        failed = db.execute("SELECT count(*) FROM sessions WHERE curation_status = 'curation_failed'").fetchone()[0]
        memories = {row[0] for row in db.execute("SELECT id FROM memories")}
        turns = {row[0] for row in db.execute("SELECT turn_id FROM turns")}
    hybrid = [i for r in records if r["system"] == "hybrid" for i in r["retrieved"]]
    hybrid_memories = {i["id"] for i in hybrid if i["store"] != "windows"}
    assert hybrid_memories <= memories and bool(hybrid_memories) == bool(memories)
    # The default also searches raw-turn windows: they come from the stored turns, curated or not.
    windows = [i for i in hybrid if i["store"] == "windows"]
    assert windows and all(set(i["turn_ids"]) <= turns for i in windows)

    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["systems"]) == systems
    for label in systems:
        mine = [r for r in records if r["system"] == label]
        overall = summary["systems"][label]["overall"]
        judged = [r["metrics"]["judge_correct"] for r in mine if r["metrics"]["judge_correct"] is not None]
        assert overall["n"] == 3
        assert overall["judge_accuracy"] == (pytest.approx(sum(judged) / len(judged)) if judged else None)
        for key in (
            "f1_official",
            "f1",
            "bleu1",
            "evidence_recall",
            "evidence_recall@10",
            "context_tokens_mean",
            "prompt_tokens_mean",
        ):
            assert key in overall
        assert set(summary["systems"][label]["by_category"]) == {r["category"] for r in mine}
    assert summary["systems"]["full-context"]["overall"]["evidence_recall@10"] is None  # nothing is ranked
    phases = summary["cost"]["phases"]
    assert phases["curation"]["units"] == 1 and phases["curation"]["requests"] >= 1
    assert phases["answering"]["requests"] == len(records)
    assert "consolidation" in phases and summary["consolidation"]["mcs10"]["conversations"] == 1
    assert summary["counts"]["full_context_truncations"] == sum(
        r["context_truncated"] for r in records if r["system"] == "full-context"
    )
    assert "malformed_evidence" in summary["counts"]
    assert summary["counts"]["curation_failed_sessions"] == failed
    # The judge audit graded a planted wrong answer for each question that has a lender.
    audit_rows = [json.loads(line) for line in (out / "judge_audit.jsonl").read_text().splitlines()]
    gold = {r["question_id"]: r["gold"] for r in records}
    assert {r["question_id"] for r in audit_rows} <= set(gold) and audit_rows
    assert all(r["planted"] == gold[r["planted_from"]] != r["gold"] for r in audit_rows)
    audit = summary["judge_audit"]
    assert audit["planted"] == len(audit_rows) and audit["judge_model"] == "llamacpp:smollm2-135m-instruct"
    labelled = [r["label"] for r in audit_rows if r["label"] is not None]
    assert audit["judged"] == len(labelled) and audit["accepted"] == labelled.count("CORRECT")
    assert phases["judge_audit"]["requests"] == len(audit_rows)

    markdown = (out / "summary.md").read_text()
    assert all(f"| {label} |" in markdown for label in systems)
    with open(out / "summary.csv", newline="") as f:
        assert {r["system"] for r in csv.DictReader(f)} == set(systems)
    for plot in ("scores_by_category.png", "recall_at_k.png", "compression_vs_accuracy.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["models"]["llm"]["model_id"] == "llamacpp:smollm2-135m-instruct"
    assert manifest["models"]["llm"]["revision"]  # pinned in models_manifest.yaml
    assert manifest["prompt_versions"]["answer"].startswith("answer/")
    assert manifest["config"]["consolidation"]["every_n_sessions"] == 0
    assert manifest["command_line"] == sys.argv  # the process's command line (here: pytest's)
    assert manifest["config_hash"] and manifest["seed"] == 0


@pytest.mark.slow
def test_a_second_run_asks_the_model_nothing(first_run, e2e_config, locomo_path):
    config = load_config(e2e_config)
    cache = first_run / "llm_cache.sqlite"
    rows = _cache_rows(cache)
    from hybridmem_local.eval.runner import run_evaluation

    consolidation = json.loads((first_run / "summary.json").read_text())["consolidation"]
    again = run_evaluation(_options(locomo_path, first_run), config)
    assert again.model_calls == 0 and again.new_records == 0 and again.resumed_records == 12
    # Nothing left to answer, yet the report keeps what consolidation made of the store.
    assert consolidation["mcs10"]["conversations"] == 1 and again.summary["consolidation"] == consolidation
    # Without the predictions file every question is answered and judged again, from the cache.
    # Only successful replies are cached, so a reply that failed the first time (SmolLM2's judge
    # verdicts sometimes do) is asked again, and nothing else is.
    (first_run / "predictions.jsonl").rename(first_run / "predictions.before.jsonl")
    first = [json.loads(line) for line in (first_run / "predictions.before.jsonl").read_text().splitlines()]
    failed_answers = sum(r["answer_error"] is not None for r in first)
    failed_judgements = sum(r["answer_error"] is None and r["judge_error"] is not None for r in first)
    replay = run_evaluation(_options(locomo_path, first_run), config)
    assert replay.new_records == 12
    answering, judging = replay.usage["answering"], replay.usage["judging"]
    assert answering.requests == 12 and answering.cached == 12 - failed_answers
    assert answering.model_calls == failed_answers
    if failed_answers == 0:
        assert judging.model_calls == failed_judgements
    assert rows <= _cache_rows(cache) <= rows + replay.model_calls
    before = {(r["system"], r["question_id"]): r["prediction"] for r in first if r["answer_error"] is None}
    after = {
        (r["system"], r["question_id"]): r["prediction"]
        for r in map(json.loads, (first_run / "predictions.jsonl").read_text().splitlines())
    }
    assert {key: after[key] for key in before} == before


@pytest.mark.slow
def test_retrieval_only_reuses_curated_stores_without_any_llm_call(first_run, e2e_config, locomo_path, tmp_path):
    from hybridmem_local.eval.runner import run_evaluation

    out = tmp_path / "recall"
    result = run_evaluation(
        _options(locomo_path, out, systems=["hybrid", "rag"], retrieval_only=True, stores=first_run / "stores"),
        load_config(e2e_config),
    )
    assert result.model_calls == 0
    assert sum(u.requests for u in result.usage.values()) == 0  # not even a cached one
    assert _cache_rows(out / "llm_cache.sqlite") == 0
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(r["prediction"] is None and r["verdict"] is None for r in records)
    summary = json.loads((out / "summary.json").read_text())
    for label in ("hybrid", "rag"):
        overall = summary["systems"][label]["overall"]
        assert overall["judge_accuracy"] is None and overall["evidence_recall"] is not None
        mine = [r for r in records if r["system"] == label]
        assert overall["evidence_recall"] == pytest.approx(
            sum(r["metrics"]["evidence_recall"] for r in mine) / len(mine)
        )


@pytest.mark.slow
def test_the_answering_switches_flow_into_the_records(first_run, e2e_config, locomo_path, tmp_path):
    from hybridmem_local.eval.runner import run_evaluation

    records = {}
    for mode, evidence_turns in (("json", False), ("text", True)):
        out = tmp_path / mode
        config = load_config(e2e_config, {"answering.mode": mode, "answering.evidence_turns": evidence_turns})
        run_evaluation(_options(locomo_path, out, systems=["hybrid"], stores=first_run / "stores"), config)
        records[mode] = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert json.loads((out / "manifest.json").read_text())["config"]["answering"]["mode"] == mode
        assert len(records[mode]) == 3
        for record in records[mode]:
            assert (record["answer_mode"], record["evidence_turns"]) == (mode, evidence_turns)
            # Citations resolve to memories shown (text mode derives them from exactly those).
            shown = {i["id"] for i in record["retrieved"] if i["shown"] and i["store"] != "windows"}
            assert set(record["cited_memory_ids"]) <= shown
    # Another answering config is another run: the keys differ, nothing is reused between them.
    assert {r["run_key"] for r in records["json"]}.isdisjoint(r["run_key"] for r in records["text"])


def _longmemeval_file(path: Path) -> Path:
    """Two instances in the official format; the answer of the first is in its second session."""

    def session(topic: str, answer: bool = False) -> list[dict]:
        return [
            {"role": "user", "content": f"Let me tell you about {topic}.", "has_answer": answer},
            {"role": "assistant", "content": f"Sure, tell me more about {topic}."},
        ]

    instances = [
        {
            "question_id": "q-bike",
            "question_type": "single-session-user",
            "question": "What colour is my bike?",
            "answer": "red",
            "question_date": "2023/06/01 (Thu) 10:00",
            "haystack_session_ids": ["s-garden", "s-bike", "s-cook"],
            "haystack_dates": ["2023/05/01 (Mon) 09:00", "2023/05/08 (Mon) 09:00", "2023/05/15 (Mon) 09:00"],
            "haystack_sessions": [
                session("my garden and its tomatoes"),
                session("my new red bike", answer=True),
                session("cooking pasta on Sundays"),
            ],
            "answer_session_ids": ["s-bike"],
        },
        {
            "question_id": "q-dog_abs",
            "question_type": "multi-session",
            "question": "What is my cat called?",
            "answer": "You never mentioned a cat.",
            "question_date": "2023/06/01 (Thu) 10:00",
            "haystack_session_ids": ["s-dog"],
            "haystack_dates": ["2023/05/01 (Mon) 09:00"],
            "haystack_sessions": [session("my dog Rex")],
            "answer_session_ids": [],
        },
    ]
    path.write_text(json.dumps(instances))
    return path


@pytest.mark.slow
def test_longmemeval_retrieval_only_reports_session_recall(e2e_config, tmp_path):
    from hybridmem_local.eval.runner import run_evaluation

    data = _longmemeval_file(tmp_path / "lme.json")
    options = RunOptions(
        benchmark="longmemeval",
        data=data,
        out=tmp_path / "out",
        systems=["rag", "full-context"],
        retrieval_only=True,
        recall_ks=[1, 2],
    )
    result = run_evaluation(options, load_config(e2e_config))
    assert result.model_calls == 0
    records = {
        (r["system"], r["question_id"]): r
        for r in map(json.loads, (tmp_path / "out" / "predictions.jsonl").read_text().splitlines())
    }
    assert len(records) == 4
    bike = records[("rag", "q-bike")]
    ranked_sessions = list(dict.fromkeys(t.rsplit(":", 1)[0] for item in bike["retrieved"] for t in item["turn_ids"]))
    assert bike["metrics"]["session_recall@1"] == (ranked_sessions[:1] == ["s-bike"])
    assert bike["metrics"]["session_recall@2"] == ("s-bike" in ranked_sessions[:2])
    assert bike["metrics"]["evidence_recall"] is True  # three short sessions fit the budget whole
    # No evidence and no answer session: not scorable, left out of the means.
    assert records[("rag", "q-dog_abs")]["metrics"]["evidence_recall"] is None
    assert records[("rag", "q-dog_abs")]["metrics"]["session_recall@1"] is None
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert set(summary["systems"]["rag"]["by_category"]) == {"single-session-user", "multi-session"}
    assert summary["systems"]["full-context"]["overall"]["session_recall@1"] is None


def test_a_phase_s_usage_is_on_disk_when_it_ends_so_a_killed_run_keeps_it(tmp_path):
    """A run killed mid-way (a machine handed back: no ``finally`` runs) keeps the cost of the
    phases it finished, as it keeps their predictions; the resumed run adds only its own."""
    from hybridmem_local.eval.accounting import PhaseUsage
    from hybridmem_local.eval.runner import _Run, evaluation_config

    out = tmp_path / "out"
    out.mkdir()
    options = RunOptions(benchmark="locomo", data=tmp_path / "locomo.json", out=out, systems=["hybrid"])
    run = _Run(options, evaluation_config(Config()), Console(file=io.StringIO()))
    run._record_usage("answering", PhaseUsage(requests=3, cached=1, wall_s=60.0, units=3), "conv-1", "hybrid")
    [row] = [json.loads(line) for line in (out / "usage.jsonl").read_text().splitlines()]
    assert (row["phase"], row["conversation_id"], row["system"], row["requests"], row["cached"]) == (
        "answering",
        "conv-1",
        "hybrid",
        3,
        1,
    )
    assert row["config_hash"] == run.config_hash and row["wall_s"] == 60.0


def test_a_phase_recorded_in_parts_counts_each_part_once():
    from hybridmem_local.eval.accounting import PhaseUsage

    usage = PhaseUsage(requests=4, cached=1, prompt_tokens=900, wall_s=30.0, units=2)
    part = usage.take()
    assert (part.requests, part.cached, part.prompt_tokens, part.wall_s, part.units) == (4, 1, 900, 30.0, 2)
    assert usage == PhaseUsage()  # counting on from zero: the next part holds only what follows
    usage.requests += 2
    assert usage.take().requests == 2 and part.requests == 4


@pytest.mark.slow
def test_a_results_folder_with_checkpoints_resumes_on_a_machine_without_stores_or_cache(
    e2e_config, locomo_path, tmp_path
):
    """Machine A curates, consolidates and answers with ``checkpoints``; machine B has only the
    results folder (no stores, no LLM cache): it rebuilds the stores from the checkpoints and
    answers from the same store without one curation or consolidation call. (SmolLM2's
    curations carry no valid memory, so this checks the runner's path, the sessions and their
    evidence windows; test_checkpoints rebuilds stores that hold memories of every status.)"""
    from hybridmem_local.eval.runner import RunResult, run_evaluation

    config = load_config(e2e_config)
    out = tmp_path / "shard"
    systems = ["fused", "hybrid+consolidation"]
    options = _options(locomo_path, out, systems=systems, limit=2, checkpoints=True, mcs=[2], batch_size=1)
    first = run_evaluation(options, config)
    assert first.usage["curation"].model_calls > 0
    # The judge audit is saved batch by batch (here of one answer each), its rows and their cost.
    audited = (out / "judge_audit.jsonl").read_text().splitlines()
    costs = [json.loads(line) for line in (out / "usage.jsonl").read_text().splitlines()]
    assert len(audited) > 1 and len([c for c in costs if c["phase"] == "judge_audit"]) == len(audited)
    checkpoints = sorted(p.name for p in (out / "memories").iterdir())
    assert checkpoints == ["conv-26.consolidated-mcs2.jsonl", "conv-26.jsonl"]
    assert (
        '"session_id": "conv-26:session_1", "curation_status": "curated"'
        in (out / "memories" / "conv-26.jsonl").read_text()
    )
    [sample] = [c for c in json.loads(locomo_path.read_text()) if c["sample_id"] == "conv-26"]
    turns = [t["text"] for t in sample["conversation"]["session_1"]]
    assert not any(text in (out / "memories" / name).read_text() for name in checkpoints for text in turns)
    before = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]

    def new_machine(*records: str) -> RunResult:
        for left_behind in ("stores", "llm_cache.sqlite", *records):
            path = out / left_behind
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return run_evaluation(options, config)

    # Machine B has the results folder, not the stores or the LLM cache: nothing to ask, and the
    # report still has what consolidation made (from the checkpoint, the copy being elsewhere).
    resumed = new_machine()
    assert resumed.model_calls == 0 and resumed.new_records == 0
    assert resumed.summary["consolidation"] == first.summary["consolidation"]
    # Machine C, without the predictions either: every question is answered again (no cache)
    # from stores rebuilt from the checkpoints, which retrieve what machine A's stores did.
    again = new_machine("predictions.jsonl")
    assert again.usage["curation"].requests == 0 and again.usage["consolidation"].requests == 0
    assert again.usage["answering"].model_calls == first.usage["answering"].model_calls > 0
    assert again.summary["consolidation"] == first.summary["consolidation"]
    after = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]

    def retrieved(records: list[dict]) -> dict:
        """What each question retrieved (memory ids may differ on the rebuilt store) and showed."""
        return {
            (r["system"], r["question_id"]): (
                [(item["store"], item["turn_ids"], item["shown"]) for item in r["retrieved"]],
                r["context_tokens"],
            )
            for r in records
        }

    assert retrieved(after) == retrieved(before)
    assert any(item[0] == "windows" for items, _ in retrieved(after).values() for item in items)
