"""Run reports: the summary (JSON, Markdown, CSV), the plots and the manifest of a results folder.

``summary.json`` holds, per system variant, ``overall`` and ``by_category`` blocks with stable
keys (:data:`RATE_METRICS` plus ``evidence_recall@k`` / ``session_recall@k`` for each reported
k, :data:`MEAN_FIELDS` and :data:`COUNT_FIELDS`; a figure that does not apply is ``null``; and
``ci95``, the bootstrap 95% interval over questions of each rate metric), then ``cost`` (LLM
use per phase), ``counts`` (data problems, truncations, skips), ``consolidation`` (compression
per min_cluster_size), ``judge_audit`` (the judge's false-accept rate on planted wrong answers,
``eval/judge_audit.py``) and the run options. ``summary.md`` and
``summary.csv`` show the same figures, systems side by side; the plots are PNGs drawn with
matplotlib's Agg backend (no display needed). ``hybridmem eval report DIR`` redraws them from
``summary.json``.
"""

from __future__ import annotations

import csv
import json
import platform
import subprocess
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hybridmem_local.config import Config
from hybridmem_local.eval.metrics import aggregate, bootstrap_interval, paired_difference

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
PAIRED_METRICS = ("judge_accuracy", "judge_accuracy_audited", "f1", "evidence_recall")
#: Per-question quantities averaged over the questions that have them.
MEAN_FIELDS = {
    "context_tokens_mean": "context_tokens",
    "prompt_tokens_mean": "prompt_tokens",
    "answer_latency_s_mean": "answer_s",
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
            interval = bootstrap_interval(values)
            intervals[name] = None if interval is None else list(interval)
    for name, field in MEAN_FIELDS.items():
        block[name] = aggregate([r.get(field) for r in records]).overall.mean
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
    """:data:`PAIRED_COMPARISONS` between the run's variants, over the questions both answered."""
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
            for metric in PAIRED_METRICS:
                source = _SOURCES.get(metric, metric)
                difference = paired_difference(
                    [mine[q]["metrics"].get(source) for q in shared], [theirs[q]["metrics"].get(source) for q in shared]
                )
                if difference.n:
                    out.append(
                        {
                            "system": run["label"],
                            "baseline": base["label"],
                            "metric": metric,
                            **difference.model_dump(mode="json"),
                        }
                    )
    return out


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


# --------------------------------------------------------------------------- files


def write_report(out: Path, summary: dict[str, Any], manifest: dict[str, Any] | None = None) -> list[Path]:
    """Write summary.json/.md/.csv, the plots and (when given) manifest.json; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / SUMMARY_JSON, out / SUMMARY_MD, out / SUMMARY_CSV]
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / SUMMARY_MD).write_text(render_markdown(summary, manifest), encoding="utf-8")
    write_csv(summary, out / SUMMARY_CSV)
    if manifest is not None:
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        written.append(out / MANIFEST)
    written.extend(write_plots(summary, out))
    return written


def headline_metric(summary: dict[str, Any]) -> str:
    """The score the plots show: judge accuracy when any answer was judged, else evidence recall."""
    judged = any(e["overall"].get("judge_accuracy") is not None for e in summary["systems"].values())
    return "judge_accuracy" if judged else "evidence_recall"


def _columns(summary: dict[str, Any]) -> list[str]:
    return [*RATE_METRICS, *recall_keys(summary["recall_ks"]), *MEAN_FIELDS, *COUNT_FIELDS]


def _interval(block: dict[str, Any], name: str) -> list[float] | None:
    return (block.get("ci95") or {}).get(name)


def write_csv(summary: dict[str, Any], path: Path) -> None:
    """One row per system and category (``overall`` first), every figure a column, then the
    95% interval of each rate metric as ``<metric>_ci95_low`` / ``_high``."""
    columns = _columns(summary)
    bounds = [(name, end) for name in RATE_METRICS for end in ("low", "high")]
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["system", "category", *columns, *(f"{name}_ci95_{end}" for name, end in bounds)])
        for label, entry in summary["systems"].items():
            for category, block in [("overall", entry["overall"]), *entry["by_category"].items()]:
                cells = ["" if block.get(c) is None else block.get(c) for c in columns]
                ends = [_interval(block, name) for name, _ in bounds]
                cells += [
                    "" if pair is None else pair[end == "high"] for pair, (_, end) in zip(ends, bounds, strict=True)
                ]
                writer.writerow([label, category, *cells])


def _cell(block: dict[str, Any], name: str) -> str:
    """A figure for the Markdown tables; a rate metric with its 95% interval, e.g. ``62.5 (50.0–75.0)``."""
    text = _fmt(name, block.get(name))
    interval = _interval(block, name)
    if interval is not None and name in RATE_METRICS:
        text += f" ({100 * interval[0]:.1f}–{100 * interval[1]:.1f})"
    return text


def _fmt(name: str, value: Any) -> str:
    if value is None:
        return "–"
    if name in RATE_METRICS or "recall@" in name:
        return f"{100 * value:.1f}"
    if name.endswith("_s_mean"):
        return f"{value:.2f}"
    if isinstance(value, float):
        return f"{value:.0f}"
    return str(value)


_TITLES = {
    "judge_accuracy": "LLM judge",
    "f1_official": "F1 (LoCoMo)",
    "f1": "F1",
    "bleu1": "BLEU-1",
    "evidence_recall": "evidence recall",
    "judge_accuracy_audited": "judge (audited gold)",
    "f1_audited": "F1 (audited gold)",
    "evidence_recall_audited": "evidence recall (audited)",
    "context_tokens_mean": "context tok",
    "prompt_tokens_mean": "prompt tok",
    "answer_latency_s_mean": "answer s",
    "retrieval_latency_s_mean": "retrieval s",
    "n": "n",
    "context_truncations": "truncated",
}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _has_values(summary: dict[str, Any], name: str) -> bool:
    return any(entry["overall"].get(name) is not None for entry in summary["systems"].values())


def render_markdown(summary: dict[str, Any], manifest: dict[str, Any] | None = None) -> str:
    systems = summary["systems"]
    lines = [f"# {summary['benchmark']} evaluation", ""]
    if manifest:
        models = manifest["models"]
        lines += [
            f"- answer LLM `{models['llm']['model_id']}`, judge `{models['judge']['model_id']}`, "
            f"embedder `{models['embedder']['model_id']}`",
            f"- config `{manifest['config_hash']}`, commit `{manifest['git_commit'] or 'unknown'}`"
            + (" (with uncommitted changes)" if manifest.get("git_dirty") else ""),
            f"- retrieval mode `{manifest['config']['retrieval']['mode']}`, k = {manifest['config']['retrieval']['k']}",
        ]
    counts = summary["counts"]
    options = summary["options"]
    lines += [
        f"- {counts.get('conversations')} conversations, {counts.get('questions')} questions, "
        f"{counts.get('sessions')} sessions ingested"
        + (f" (first {options['max_sessions']} per conversation)" if options.get("max_sessions") else "")
        + (f"; first {options['limit']} questions per conversation" if options.get("limit") else ""),
        "- scores are percentages; judge accuracy is the LLM-as-a-judge score (paper Table 1); "
        "in parentheses the bootstrap 95% interval over questions"
        + ("; retrieval only: no answers, no judge" if summary["retrieval_only"] else ""),
        *_audit_lines(summary.get("judge_audit")),
        "",
        "## Overall",
        "",
    ]
    columns = [c for c in (*RATE_METRICS, *recall_keys(summary["recall_ks"])) if _has_values(summary, c)]
    columns += [*MEAN_FIELDS, "n", "context_truncations"]
    lines += _table(
        ["system", *(_TITLES.get(c, c) for c in columns)],
        [[label, *(_cell(entry["overall"], c) for c in columns)] for label, entry in systems.items()],
    )
    categories = ordered_categories(c for entry in systems.values() for c in entry["by_category"])
    for metric in [m for m in (*RATE_METRICS, "evidence_recall@10") if _has_values(summary, m)]:
        lines += [f"## {_TITLES.get(metric, metric)} by category", ""]
        rows = [
            [category, *(_cell(systems[s]["by_category"].get(category, {}), metric) for s in systems)]
            for category in categories
        ]
        rows.append(["**overall**", *(_cell(systems[s]["overall"], metric) for s in systems)])
        lines += _table(["category", *systems], rows)
    if summary.get("differences"):
        lines += [
            "## Paired differences",
            "",
            "The same questions answered by both systems; in parentheses the paired bootstrap 95% interval "
            "(an interval that excludes 0 is a difference the sample decides).",
            "",
        ]
        lines += _table(
            ["system − baseline", "metric", "questions", "difference (points)"],
            [
                [
                    f"{d['system']} − {d['baseline']}",
                    _TITLES.get(d["metric"], d["metric"]),
                    str(d["n"]),
                    f"{100 * d['difference']:+.1f}"
                    + ("" if d["ci95"] is None else f" ({100 * d['ci95'][0]:+.1f} to {100 * d['ci95'][1]:+.1f})"),
                ]
                for d in summary["differences"]
            ],
        )
    if summary["consolidation"]:
        lines += ["## Consolidation", ""]
        lines += _table(
            ["mcs", "memories before", "after", "compression %", "clusters", "merges", "deletions", "LLM requests"],
            [
                [
                    str(c["mcs"]),
                    str(c["memories_before"]),
                    str(c["memories_after"]),
                    f"{c['compression_pct']:.1f}",
                    str(c["clusters"]),
                    str(c["merges"]),
                    str(c["deletions"]),
                    str(c["llm_requests"]),
                ]
                for c in summary["consolidation"].values()
            ],
        )
    phases = summary["cost"]["phases"]
    if phases:
        lines += [f"## Cost ({summary['cost']['invocations']} invocation(s) summed)", ""]
        lines += _table(
            [
                "phase",
                "requests",
                "to the model",
                "cached",
                "failed",
                "prompt tok",
                "completion tok",
                "LLM s",
                "wall s",
                "requests per unit",
            ],
            [
                [
                    name,
                    str(p["requests"]),
                    str(p["model_calls"]),
                    str(p["cached"]),
                    str(p["failed"]),
                    str(p["prompt_tokens"]),
                    str(p["completion_tokens"]),
                    f"{p['llm_s']:.0f}",
                    f"{p['wall_s']:.0f}",
                    "–"
                    if p["per_unit"] is None
                    else f"{p['per_unit']:.2f} / {'session' if name in ('curation', 'consolidation') else 'question'}",
                ]
                for name, p in phases.items()
            ],
        )
    if summary.get("judge_prompts"):
        lines += [
            "## The judge's error rates, per prompt",
            "",
            "Over the whole sample: planted wrong answers (another question's gold answer) it accepts, "
            "and gold answers reworded without changing their meaning it rejects; 95% intervals.",
            "",
        ]
        lines += _table(
            ["prompt", "false accepts", "false rejects"],
            [
                [
                    prompt,
                    _rate(a, "accepted", "false_accept_rate"),
                    _rate(a["reworded"], "rejected", "false_reject_rate"),
                ]
                for prompt, a in summary["judge_prompts"].items()
            ],
        )
    precision = summary.get("memory_precision")
    if precision and precision["labelled"]:
        low, high = precision["ci95"]
        lines += [
            "## Memory precision",
            "",
            f"{precision['labelled']} curated memories drawn at random, each read beside the turns it cites: "
            f"{100 * precision['precision']:.0f}% right ({100 * low:.0f}–{100 * high:.0f}).",
            "",
        ]
        lines += _table(["class", "memories"], [[name, str(n)] for name, n in precision["labels"].items()])
        lines += [
            f"The subject check (a memory about someone who neither speaks nor is named in a turn it cites) flags "
            f"{precision['check_flags_wrong_speaker']} wrong-speaker memories, {precision['check_flags_right']} "
            f"right ones and {precision['check_flags_other_wrong']} other wrong ones.",
            "",
        ]
    if summary.get("shards"):
        lines += ["## Shards", ""]
        lines += _table(
            ["shard", "questions", "wall s", "by phase (s)", "CPU", "commit"],
            [
                [
                    s["folder"],
                    str(s["questions"]),
                    f"{s['wall_s']:.0f}",
                    ", ".join(f"{p} {t:.0f}" for p, t in s["wall_s_by_phase"].items()),
                    str(s.get("cpu")),
                    str(s.get("git_commit"))[:10],
                ]
                for s in summary["shards"]
            ],
        )
    lines += ["## Counts", ""]
    lines += [f"- {name.replace('_', ' ')}: {json.dumps(value)}" for name, value in counts.items()]
    return "\n".join(lines) + "\n"


def _rate(block: dict[str, Any], errors: str, rate: str) -> str:
    if not block.get("judged"):
        return "–"
    low, high = block["ci95"]
    return f"{block[errors]} of {block['judged']}: {100 * block[rate]:.1f}% ({100 * low:.1f}–{100 * high:.1f})"


def _audit_lines(audit: dict[str, Any] | None) -> list[str]:
    if not audit:
        return []
    lines = []
    if audit["judged"]:
        low, high = audit["ci95"]
        lines.append(
            f"- judge false-accept rate: {100 * audit['false_accept_rate']:.1f}% ({100 * low:.1f}–{100 * high:.1f}) "
            f"of {audit['judged']} planted wrong answers (another question's gold answer about the same "
            f"conversation) were labelled CORRECT; judge accuracy overstates by up to that share of the wrong answers"
        )
    reworded = audit.get("reworded") or {}
    if reworded.get("judged"):
        low, high = reworded["ci95"]
        lines.append(
            f"- judge false-reject rate: {100 * reworded['false_reject_rate']:.1f}% ({100 * low:.1f}–{100 * high:.1f}) "
            f"of {reworded['judged']} gold answers reworded without changing their meaning (a date written "
            f"another way, a list reordered, the answer in a sentence) were labelled WRONG"
        )
    return lines


# --------------------------------------------------------------------------- plots


def write_plots(summary: dict[str, Any], out: Path) -> list[Path]:
    """scores_by_category.png always; recall_at_k.png, k_sweep.png and
    compression_vs_accuracy.png when the run has what they show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, draw in (
        ("scores_by_category.png", _plot_categories),
        ("recall_at_k.png", _plot_recall_at_k),
        ("k_sweep.png", _plot_k_sweep),
        ("compression_vs_accuracy.png", _plot_compression),
    ):
        figure = draw(plt, summary)
        if figure is not None:
            figure.tight_layout()
            figure.savefig(out / name, dpi=120, bbox_inches="tight")
            plt.close(figure)
            written.append(out / name)
    return written


def _plot_categories(plt, summary):
    metric = headline_metric(summary)
    systems = {label: entry for label, entry in summary["systems"].items() if entry["overall"]["n"]}
    if not systems:
        return None
    categories = ordered_categories(c for e in systems.values() for c in e["by_category"]) + ["overall"]
    figure, axis = plt.subplots(figsize=(max(6, 1.4 * len(categories) + 2), 4.5))
    width = 0.8 / max(len(systems), 1)
    for i, (label, entry) in enumerate(systems.items()):
        values = [
            (entry["overall"] if c == "overall" else entry["by_category"].get(c, {})).get(metric) for c in categories
        ]
        axis.bar([x + i * width for x in range(len(categories))], [100 * (v or 0) for v in values], width, label=label)
    axis.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(categories))], categories)
    axis.set_ylabel(f"{_TITLES.get(metric, metric)} (%)")
    axis.set_ylim(0, 100)
    axis.set_title(f"{summary['benchmark']}: {_TITLES.get(metric, metric)} by category")
    axis.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))  # outside: bars reach 100
    return figure


def _plot_recall_at_k(plt, summary):
    ks = summary["recall_ks"]
    curves = {
        label: [entry["overall"].get(f"evidence_recall@{k}") for k in ks] for label, entry in summary["systems"].items()
    }
    curves = {label: values for label, values in curves.items() if any(v is not None for v in values)}
    if not curves:
        return None
    figure, axis = plt.subplots(figsize=(6, 4))
    for label, values in curves.items():
        axis.plot(ks, [100 * (v or 0) for v in values], marker="o", label=label)
    axis.set_xticks(ks)
    axis.set_xlabel("retrieval budget k (episodes k, tuples 2k, windows k)")
    axis.set_ylabel("questions with all evidence retrieved (%)")
    axis.set_ylim(0, 100)
    axis.set_title("evidence recall@k")
    axis.legend(fontsize="small")
    return figure


def _plot_k_sweep(plt, summary):
    groups: dict[tuple, list[tuple[int, dict]]] = {}
    for entry in summary["systems"].values():
        groups.setdefault((entry["system"], entry["mcs"]), []).append((entry["k"], entry["overall"]))
    groups = {key: sorted(points, key=lambda p: p[0]) for key, points in groups.items() if len(points) > 1}
    if not groups:
        return None
    metric = headline_metric(summary)
    figure, axis = plt.subplots(figsize=(6, 4))
    for (system, mcs), points in groups.items():
        name = system + (f" (mcs {mcs})" if mcs is not None else "")
        axis.plot([k for k, _ in points], [100 * (o.get(metric) or 0) for _, o in points], marker="o", label=name)
    axis.set_xticks(sorted({k for points in groups.values() for k, _ in points}))
    axis.set_xlabel("retrieval budget k")
    axis.set_ylabel(f"{_TITLES.get(metric, metric)} (%)")
    axis.set_title("retrieval budget sweep")
    axis.legend(fontsize="small")
    return figure


def _plot_compression(plt, summary):
    if not summary["consolidation"]:
        return None
    metric = headline_metric(summary)
    points = []
    for entry in summary["systems"].values():
        if entry["system"] == "hybrid+consolidation":
            totals = summary["consolidation"].get(f"mcs{entry['mcs']}")
            if totals is not None:
                points.append(
                    (totals["compression_pct"], entry["overall"].get(metric), f"mcs {entry['mcs']} k {entry['k']}")
                )
        elif entry["system"] == "hybrid":
            points.append((0.0, entry["overall"].get(metric), f"no consolidation k {entry['k']}"))
    points = [p for p in points if p[1] is not None]
    if not points:
        return None
    figure, axis = plt.subplots(figsize=(6, 4))
    for x, y, name in points:
        axis.scatter([x], [100 * y])
        axis.annotate(name, (x, 100 * y), textcoords="offset points", xytext=(4, 4), fontsize="small")
    axis.set_xlabel("memory-store compression (%)")
    axis.set_ylabel(f"{_TITLES.get(metric, metric)} (%)")
    axis.set_title("consolidation: compression vs accuracy")
    return figure
