"""Run reports: the summary and the manifest of a results folder (``render.py`` writes them out).

``summary.json`` holds, per system variant, ``overall`` and ``by_category`` blocks with stable
keys (:data:`RATE_METRICS` plus ``evidence_recall@k`` / ``session_recall@k`` for each reported
k, :data:`MEAN_FIELDS` and :data:`COUNT_FIELDS`; a figure that does not apply is ``null``; and
``ci95``, the 95% interval over questions of each rate metric and mean: Wilson's for right/wrong
scores, the bootstrap for graded ones and means, ``metrics.score_interval``), then ``cost`` (LLM
use per phase, and seconds per answer per system, :func:`answer_costs`), ``counts`` (data
problems, truncations, skips), ``consolidation`` (compression per min_cluster_size),
``differences`` (paired bootstrap differences between the systems the paper compares),
``judge_audit`` (the judge's false-accept and false-reject rates, ``eval/judge_audit.py``) and
the run options. ``render.py`` draws ``summary.md``, ``summary.csv`` and the plots from it;
``hybridmem eval report DIR`` redraws them from ``summary.json``.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hybridmem_local.config import Config
from hybridmem_local.eval.metrics import (
    aggregate,
    bootstrap_interval,
    paired_difference,
    ratio_interval,
    score_interval,
)

#: Per-question values averaged into rates (judge_accuracy averages ``judge_correct``).
RATE_METRICS = (
    "judge_accuracy",
    "f1_official",
    "f1",
    "bleu1",
    "evidence_recall",
    "judge_accuracy_audited",
    "f1_audited",
    "evidence_recall_audited",
)
#: Summary name → the per-question metric it averages, where they differ.
_SOURCES = {"judge_accuracy": "judge_correct", "judge_accuracy_audited": "judge_correct_audited"}
#: The differences the paper claims, as (system, baseline) by system name; each consolidated
#: variant is compared with the hybrid system at the same k.
PAIRED_COMPARISONS = (
    ("hybrid", "episodic-only"),
    ("hybrid", "relational-only"),
    ("hybrid+consolidation", "hybrid"),
    ("hybrid", "rag"),
    ("fused", "hybrid"),
)
#: Metrics the paired differences are given for.
PAIRED_METRICS = ("judge_accuracy", "judge_accuracy_audited", "f1_official", "f1", "evidence_recall")
#: Per-question quantities averaged over the questions that have them, each with its bootstrap
#: interval. A question's own answer seconds are not among them: answers are decoded in batches
#: and a cached answer costs a lookup, so seconds per answer come from the runs' usage rows
#: (:func:`answer_costs`).
MEAN_FIELDS = {
    "context_tokens_mean": "context_tokens",
    "prompt_tokens_mean": "prompt_tokens",
    "retrieval_latency_s_mean": "retrieval_s",
}
COUNT_FIELDS = ("n", "judged", "answer_failures", "judge_failures", "context_truncations")
#: LoCoMo categories in the paper's column order (Table 1), then the rest alphabetically.
CATEGORY_ORDER = ("single-hop", "multi-hop", "open-domain", "temporal", "adversarial")

SUMMARY_JSON, SUMMARY_MD, SUMMARY_CSV, MANIFEST = "summary.json", "summary.md", "summary.csv", "manifest.json"


# --------------------------------------------------------------------------- summary


def recall_keys(recall_ks: Sequence[int]) -> list[str]:
    return [f"evidence_recall@{k}" for k in recall_ks] + [f"session_recall@{k}" for k in recall_ks]


def _block(records: list[dict], recall_ks: Sequence[int]) -> dict[str, Any]:
    """One figures block (overall or one category) over ``records``."""
    block: dict[str, Any] = {}
    intervals: dict[str, list[float] | None] = {}
    for name in (*RATE_METRICS, *recall_keys(recall_ks)):
        source = _SOURCES.get(name, name)
        values = [r["metrics"].get(source) for r in records]
        block[name] = aggregate(values).overall.mean
        if name in RATE_METRICS:
            interval = score_interval(values)
            intervals[name] = None if interval is None else list(interval)
    for name, field in MEAN_FIELDS.items():
        values = [r.get(field) for r in records]
        block[name] = aggregate(values).overall.mean
        interval = bootstrap_interval(values)
        intervals[name] = None if interval is None else list(interval)
    block["n"] = len(records)
    block["judged"] = sum(r["metrics"].get("judge_correct") is not None for r in records)
    block["answer_failures"] = sum(r.get("answer_error") is not None for r in records)
    block["judge_failures"] = sum(r.get("judge_error") is not None for r in records)
    block["context_truncations"] = sum(bool(r.get("context_truncated")) for r in records)
    block["ci95"] = intervals
    return block


def ordered_categories(categories: Iterable[str]) -> list[str]:
    present = set(categories)
    return [c for c in CATEGORY_ORDER if c in present] + sorted(present - set(CATEGORY_ORDER))


def build_summary(
    *,
    records: list[dict],
    runs: list[dict],
    benchmark: str,
    recall_ks: Sequence[int],
    retrieval_only: bool,
    cost: dict,
    counts: dict,
    consolidation: dict[str, list[dict]],
    options: dict,
    judge_audit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of ``records`` (the current run's lines of ``predictions.jsonl``)."""
    systems: dict[str, Any] = {}
    for run in runs:
        mine = [r for r in records if r["system"] == run["label"]]
        by_category = {}
        for category in ordered_categories(r["category"] for r in mine):
            by_category[category] = _block([r for r in mine if r["category"] == category], recall_ks)
        systems[run["label"]] = {
            "run_key": run.get("run_key"),
            "system": run["system"],
            "k": run["k"],
            "mcs": run["mcs"],
            "overall": _block(mine, recall_ks),
            "by_category": by_category,
        }
    counts = dict(counts)
    counts["full_context_truncations"] = sum(
        bool(r.get("context_truncated")) for r in records if r.get("system_name") == "full-context"
    )
    return {
        "benchmark": benchmark,
        "retrieval_only": retrieval_only,
        "recall_ks": list(recall_ks),
        "systems": systems,
        "differences": paired_differences(records, runs),
        "cost": cost,
        "counts": counts,
        "consolidation": {name: consolidation_totals(entries) for name, entries in sorted(consolidation.items())},
        "judge_audit": judge_audit,
        "options": options,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def paired_differences(records: list[dict], runs: list[dict]) -> list[dict[str, Any]]:
    """:data:`PAIRED_COMPARISONS` between the run's variants, over the questions both answered,
    overall and per category (the paper claims its gains per category)."""
    by_question: dict[str, dict[str, dict]] = {}
    for record in records:
        by_question.setdefault(record["system"], {})[record["question_id"]] = record
    out = []
    for name, baseline in PAIRED_COMPARISONS:
        for run in (r for r in runs if r["system"] == name):
            base = next((r for r in runs if r["system"] == baseline and r["k"] == run["k"]), None)
            if base is None or run["label"] not in by_question or base["label"] not in by_question:
                continue
            mine, theirs = by_question[run["label"]], by_question[base["label"]]
            shared = sorted(set(mine) & set(theirs))
            in_category = {
                c: [q for q in shared if mine[q]["category"] == c]
                for c in ordered_categories(mine[q]["category"] for q in shared)
            }
            for metric in PAIRED_METRICS:
                source = _SOURCES.get(metric, metric)
                overall = _paired(mine, theirs, shared, source)
                if overall["n"]:
                    by_category = {c: _paired(mine, theirs, questions, source) for c, questions in in_category.items()}
                    out.append(
                        {
                            "system": run["label"],
                            "baseline": base["label"],
                            "metric": metric,
                            **overall,
                            "by_category": {c: d for c, d in by_category.items() if d["n"]},
                        }
                    )
    return out


def _paired(mine: dict[str, dict], theirs: dict[str, dict], questions: list[str], metric: str) -> dict[str, Any]:
    """The paired difference of ``metric`` between two systems' records over ``questions``."""
    return paired_difference(
        [mine[q]["metrics"].get(metric) for q in questions], [theirs[q]["metrics"].get(metric) for q in questions]
    ).model_dump(mode="json")


def consolidation_totals(entries: list[dict]) -> dict[str, Any]:
    before = sum(e["memories_before"] for e in entries)
    after = sum(e["memories_after"] for e in entries)
    return {
        "mcs": entries[0]["mcs"] if entries else None,
        "conversations": len(entries),
        "memories_before": before,
        "memories_after": after,
        "compression_pct": 100.0 * (before - after) / before if before else 0.0,
        "clusters": sum(e["clusters"] for e in entries),
        "merges": sum(e["merges"] for e in entries),
        "deletions": sum(e["deletions"] for e in entries),
        "llm_requests": sum(e["llm_requests"] for e in entries),
        "per_conversation": entries,
    }


def cost_summary(usage_rows: list[dict], config_hash: str, conversations: Sequence) -> dict[str, Any]:
    """LLM use per phase, summed over every invocation of this config in the folder.

    A resumed run adds only what it did, so the totals are what the folder's results cost.
    ``per_unit`` is requests per session (curation, consolidation) or per question.
    """
    conversation_ids = {c.conversation_id for c in conversations}
    rows = [
        r for r in usage_rows if r.get("config_hash") == config_hash and r.get("conversation_id") in conversation_ids
    ]
    return {
        "phases": phase_totals(rows),
        "answering": answer_costs(rows),
        "invocations": len({r.get("started_at") for r in usage_rows if r.get("config_hash") == config_hash}),
    }


def phase_totals(usage_rows: Iterable[dict]) -> dict[str, dict[str, Any]]:
    """``usage.jsonl`` rows summed per phase."""
    phases: dict[str, dict[str, Any]] = {}
    fields = ("requests", "cached", "failed", "prompt_tokens", "completion_tokens", "llm_s", "wall_s", "units")
    for row in usage_rows:
        phase = phases.setdefault(row["phase"], dict.fromkeys(fields, 0))
        for name in fields:
            phase[name] += row.get(name, 0)
    for phase in phases.values():
        phase["model_calls"] = phase["requests"] - phase["cached"]
        phase["per_unit"] = phase["requests"] / phase["units"] if phase["units"] else None
        phase["llm_s"] = round(phase["llm_s"], 2)
        phase["wall_s"] = round(phase["wall_s"], 2)
    return phases


def answer_costs(usage_rows: Iterable[dict]) -> dict[str, dict[str, Any]]:
    """Seconds per answer the model made, per system: the answering phase's wall time over its
    model calls, summed over the runs (a usage row per invocation, conversation and system) that
    made any. Cached answers cost a lookup and are left out. ``ci95`` is the bootstrap over those
    runs (None from one run): answers are decoded together in batches, so one answer's own
    seconds are not defined and the run is the unit that varies."""
    runs: dict[str, list[tuple[float, int]]] = {}
    for row in usage_rows:
        made = row.get("requests", 0) - row.get("cached", 0)
        if row.get("phase") == "answering" and made > 0:
            runs.setdefault(row["system"], []).append((row.get("wall_s", 0.0), made))
    costs = {}
    for system, pairs in runs.items():
        seconds, answers = [s for s, _ in pairs], [n for _, n in pairs]
        interval = ratio_interval(seconds, answers)
        costs[system] = {
            "runs": len(pairs),
            "answers": sum(answers),
            "wall_s": round(sum(seconds), 2),
            "s_per_answer": sum(seconds) / sum(answers),
            "ci95": None if interval is None else list(interval),
        }
    return costs


# --------------------------------------------------------------------------- manifest


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _model_entry(name: str) -> dict[str, Any]:
    from hybridmem_local.errors import ModelRegistryError
    from hybridmem_local.weights.manifest import load_manifest

    try:
        entry = load_manifest().find(name)
    except ModelRegistryError:
        entry = None
    if entry is None:
        return {"name": name, "in_manifest": False}
    return {"name": name, "in_manifest": True, "hub_id": entry.hub_id, "revision": entry.revision}


def build_manifest(
    config: Config,
    config_hash: str,
    command: list[str],
    judge_model_id: str,
    started: datetime,
    embedder_model_id: str | None = None,
) -> dict[str, Any]:
    """What reproduces the run: versions, commit, config, models, prompts, seed, command line."""
    import os

    import hybridmem_local
    from hybridmem_local.llm.cpu_kernels import read_cpu_file
    from hybridmem_local.prompts import load_prompt, prompt_names

    judge = config.judge or config.llm
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "package_version": hybridmem_local.__version__,
        "git_commit": commit,
        "git_dirty": bool(status) if status is not None else None,
        "config_hash": config_hash,
        "config": config.model_dump(mode="json"),
        "models": {
            "llm": {"model_id": f"{config.llm.backend}:{config.llm.model}", **_model_entry(config.llm.model)},
            "judge": {"model_id": judge_model_id, **_model_entry(judge.model)},
            "embedder": {"model_id": embedder_model_id, **_model_entry(config.embedder.model)},
        },
        "prompt_versions": {name: load_prompt(name).version for name in prompt_names()},
        "seed": config.llm.seed,
        "command_line": command,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        # Timings depend on the CPU: its model name and the cores this process could use.
        "cpu": read_cpu_file().model,
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "llm_threads": config.llm.n_threads,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
