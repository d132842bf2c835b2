"""Writing a run's report: ``summary.json``, ``summary.md`` and ``summary.csv`` side by side, the
plots (matplotlib's Agg backend, no display needed) and ``manifest.json``, all drawn from the
summary ``report.py`` builds, so ``hybridmem eval report DIR`` can redraw them from ``summary.json``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hybridmem_local.eval.report import (
    COUNT_FIELDS,
    MANIFEST,
    MEAN_FIELDS,
    RATE_METRICS,
    SUMMARY_CSV,
    SUMMARY_JSON,
    SUMMARY_MD,
    ordered_categories,
    recall_keys,
)

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
    95% interval of each rate metric and mean as ``<metric>_ci95_low`` / ``_high``."""
    columns = _columns(summary)
    bounds = [(name, end) for name in (*RATE_METRICS, *MEAN_FIELDS) for end in ("low", "high")]
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
    """A figure for the Markdown tables with its 95% interval, e.g. ``62.5 (50.0–75.0)``."""
    text = _fmt(name, block.get(name))
    interval = _interval(block, name)
    if interval is not None:
        text += f" ({_fmt(name, interval[0])}–{_fmt(name, interval[1])})"
    return text


def _answer_cost(summary: dict[str, Any], label: str) -> str:
    """Seconds per answer the model made (``report.answer_costs``), with the interval over runs."""
    cost = summary["cost"].get("answering", {}).get(label)
    if cost is None:
        return "–"
    interval = cost["ci95"]
    return f"{cost['s_per_answer']:.1f}" + ("" if interval is None else f" ({interval[0]:.1f}–{interval[1]:.1f})")


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
    "retrieval_latency_s_mean": "retrieval s",
    "n": "n",
    "context_truncations": "truncated",
}


def _change(difference: dict[str, Any]) -> str:
    """A paired difference in points with its interval, e.g. ``+2.4 (-2.4 to +6.8)``."""
    interval = difference["ci95"]
    text = f"{100 * difference['difference']:+.1f}"
    return text if interval is None else f"{text} ({100 * interval[0]:+.1f} to {100 * interval[1]:+.1f})"


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
        "in parentheses the 95% interval over questions (Wilson's for right/wrong scores such as the "
        "judge's, the bootstrap for graded ones such as F1 and for means such as tokens)"
        + ("; retrieval only: no answers, no judge" if summary["retrieval_only"] else ""),
        "- s per answer: the answering phase's wall seconds per answer the model made (answers decoded "
        "in batches; cached ones left out), in parentheses the bootstrap 95% interval over runs "
        "(one per conversation and invocation)",
        *_audit_lines(summary.get("judge_audit")),
        "",
        "## Overall",
        "",
    ]
    columns = [c for c in (*RATE_METRICS, *recall_keys(summary["recall_ks"])) if _has_values(summary, c)]
    columns += [*MEAN_FIELDS, "n", "context_truncations"]
    lines += _table(
        ["system", *(_TITLES.get(c, c) for c in columns), "s per answer"],
        [
            [label, *(_cell(entry["overall"], c) for c in columns), _answer_cost(summary, label)]
            for label, entry in systems.items()
        ],
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
                [f"{d['system']} − {d['baseline']}", _TITLES.get(d["metric"], d["metric"]), str(d["n"]), _change(d)]
                for d in summary["differences"]
            ],
        )
        by_category = [d for d in summary["differences"] if d["metric"] == "judge_accuracy" and d.get("by_category")]
        if by_category:
            categories = ordered_categories(c for d in by_category for c in d["by_category"])
            lines += [
                "## Paired judge differences by category",
                "",
                "The paper reports the hybrid's gains per category; in parentheses the paired bootstrap 95% "
                "interval, in brackets the questions.",
                "",
            ]
            lines += _table(
                ["system − baseline", *categories],
                [
                    [
                        f"{d['system']} − {d['baseline']}",
                        *(
                            f"{_change(d['by_category'][c])} [{d['by_category'][c]['n']}]"
                            if c in d["by_category"]
                            else "–"
                            for c in categories
                        ),
                    ]
                    for d in by_category
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
            f"The subject check (text/attribution.py: a memory about someone no cited turn speaks of) flags "
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
