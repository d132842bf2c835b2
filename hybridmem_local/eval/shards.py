"""A study made of shards: each shard one conversation evaluated start to end in its own folder,
on whichever machine ran it; the study's tables rebuilt from the shards' committed records.

    STUDY/shards/conv-26/   predictions.jsonl usage.jsonl judge_audit.jsonl summary.json manifest.json
    STUDY/shards/conv-30/   ...
    STUDY/shards/conv-44/   predictions.jsonl usage.jsonl memories/   (unfinished: no summary.json yet)
    STUDY/judge_audit.jsonl          the judge's error rates per prompt (scripts/measure_judge.py)
    STUDY/memory_precision.jsonl     sampled memories, labelled (hybridmem eval memory-sample)
    hybridmem eval report STUDY        # STUDY/summary.json, .md, .csv from every shard's records

A shard is an ordinary ``hybridmem eval locomo --conversations ID --out STUDY/shards/ID`` run
(its stores and LLM cache kept elsewhere with ``--stores`` / ``--llm-cache``: they are not
records). Its ``summary.json`` names the run key of each system variant and the judge audit's
key, so the study reads exactly the records of that run and none of an earlier one left in the
same file. Every shard must have run the same variants (label, system, k, mcs) and options that
change results; a shard that differs is an error naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybridmem_local.errors import DatasetError
from hybridmem_local.eval.judge_audit import JUDGE_AUDIT, summarise_audit
from hybridmem_local.eval.precision import MEMORY_PRECISION, summarise_precision
from hybridmem_local.eval.records import PREDICTIONS, USAGE, read_records
from hybridmem_local.eval.report import (
    MANIFEST,
    SUMMARY_JSON,
    build_summary,
    consolidation_totals,
    phase_totals,
)

SHARDS = "shards"
#: Options every shard must share for their records to form one study.
_SHARED_OPTIONS = ("benchmark", "sample", "sample_seed", "rag_budget", "recall_ks", "include_adversarial")


class Shard:
    """One shard folder's summary, manifest and records of its latest run."""

    def __init__(self, folder: Path):
        self.folder = folder
        try:
            self.summary: dict[str, Any] = json.loads((folder / SUMMARY_JSON).read_text(encoding="utf-8"))
            self.manifest: dict[str, Any] = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise DatasetError(f"shard {folder}: cannot read its {SUMMARY_JSON} / {MANIFEST}: {exc}") from exc
        keys = {(label, entry.get("run_key")) for label, entry in self.summary["systems"].items()}
        if any(key is None for _, key in keys):
            raise DatasetError(
                f"shard {folder}: {SUMMARY_JSON} names no run keys (made before shards existed); rerun it"
            )
        self.records = [r for r in read_records(folder / PREDICTIONS) if (r.get("system"), r.get("run_key")) in keys]
        self.conversations = sorted({r["conversation_id"] for r in self.records})
        config_hash = self.manifest["config_hash"]
        self.usage = [
            r
            for r in read_records(folder / USAGE)
            if r.get("config_hash") == config_hash and r.get("conversation_id") in self.conversations
        ]
        audit = self.summary.get("judge_audit") or {}
        self.audit_rows = [
            r for r in read_records(folder / JUDGE_AUDIT) if r.get("audit_key") == audit.get("audit_key")
        ]

    def runs(self) -> list[dict[str, Any]]:
        return [
            {"label": label, "system": e["system"], "k": e["k"], "mcs": e["mcs"]}
            for label, e in self.summary["systems"].items()
        ]


def shard_folders(study: Path) -> list[Path]:
    """The finished shards: folders whose run wrote its summary."""
    return [folder for folder in _folders(study) if (folder / SUMMARY_JSON).exists()]


def unfinished_shards(study: Path) -> list[Path]:
    """Shards still running, or stopped and committed to resume elsewhere (``--checkpoints``):
    records but no summary yet, so none of their records is in the study's tables."""
    return [folder for folder in _folders(study) if not (folder / SUMMARY_JSON).exists()]


def _folders(study: Path) -> list[Path]:
    return sorted(p for p in (study / SHARDS).iterdir() if p.is_dir()) if (study / SHARDS).is_dir() else []


def combine_shards(study: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The study's summary over every shard's records, and a manifest listing the shards."""
    folders = shard_folders(study)
    if not folders:
        raise DatasetError(f"{study}: no shard folders under {study / SHARDS}")
    shards = [Shard(folder) for folder in folders]
    first = shards[0]
    for shard in shards[1:]:
        if shard.runs() != first.runs():
            raise DatasetError(f"shard {shard.folder}: its system variants differ from {first.folder}'s")
        for name in _SHARED_OPTIONS:
            if shard.summary["options"].get(name) != first.summary["options"].get(name):
                raise DatasetError(
                    f"shard {shard.folder}: option {name} = {shard.summary['options'].get(name)!r}, but "
                    f"{first.folder} has {first.summary['options'].get(name)!r}"
                )
    consolidation: dict[str, list[dict]] = {}
    for shard in shards:
        for name, totals in shard.summary["consolidation"].items():
            consolidation.setdefault(name, []).extend(totals.get("per_conversation", []))
    counts: dict[str, Any] = {}
    for shard in shards:
        for name, value in shard.summary["counts"].items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                counts[name] = counts.get(name, 0) + value
    audit_rows = [row for shard in shards for row in shard.audit_rows]
    judge_model = first.manifest["models"]["judge"]["model_id"]
    summary = build_summary(
        records=[r for shard in shards for r in shard.records],
        runs=first.runs(),
        benchmark=first.summary["benchmark"],
        recall_ks=first.summary["recall_ks"],
        retrieval_only=first.summary["retrieval_only"],
        cost={"phases": phase_totals(r for shard in shards for r in shard.usage), "invocations": len(shards)},
        counts=counts,
        consolidation={},
        options={name: first.summary["options"].get(name) for name in _SHARED_OPTIONS},
        judge_audit=summarise_audit(audit_rows, judge_model) if audit_rows else None,
    )
    summary["consolidation"] = {name: consolidation_totals(entries) for name, entries in sorted(consolidation.items())}
    summary["shards"] = [
        {
            "folder": shard.folder.name,
            "conversations": shard.conversations,
            "questions": len({r["question_id"] for r in shard.records}),
            "wall_s": round(sum(r.get("wall_s", 0.0) for r in shard.usage), 1),
            "wall_s_by_phase": {p: round(t["wall_s"], 1) for p, t in phase_totals(shard.usage).items()},
            "cpu": shard.manifest.get("cpu"),
            "git_commit": shard.manifest.get("git_commit"),
            "config_hash": shard.manifest.get("config_hash"),
        }
        for shard in shards
    ]
    # The judge's error rates on the whole sample, per prompt (scripts/measure_judge.py).
    judged = read_records(study / JUDGE_AUDIT)
    summary["judge_prompts"] = {
        prompt: summarise_audit([r for r in judged if r["judge_prompt"] == prompt], judge_model)
        for prompt in sorted({r["judge_prompt"] for r in judged})
    }
    precision = read_records(study / MEMORY_PRECISION)
    summary["memory_precision"] = summarise_precision(precision) if precision else None
    manifest = {**first.manifest, "shards": [s["folder"] for s in summary["shards"]]}
    return summary, manifest
