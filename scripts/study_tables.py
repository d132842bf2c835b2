"""The tables of docs/benchmarks.md §15, drawn from the study's committed records.

    PYTHONPATH=$PWD .venv/bin/python scripts/study_tables.py                 # print them
    PYTHONPATH=$PWD .venv/bin/python scripts/study_tables.py --check docs/benchmarks.md
    PYTHONPATH=$PWD .venv/bin/python scripts/study_tables.py --write docs/benchmarks.md

Reads what ``hybridmem eval report docs/results/locomo-study`` wrote (``summary.json``) and what
``scripts/measure_date_format.py --out`` wrote (``date_format.json``), and prints five Markdown
tables: the paper's claims beside what the study measured (the document's opening table); the
systems' scores with their 95% intervals, tokens and seconds per answer; the paired differences
the paper claims, overall and the judge's per category; temporal and overall F1 as answered and
with the answers' ISO dates in words.
After a shard lands, rerun the report and the date-format script, then ``--write`` the document:
each table replaces the one whose first two column titles are its own. ``--check`` exits 1,
naming the table, when the document does not hold one of them verbatim (a test runs it, so the
document cannot drift from the records).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "docs/results/locomo-study"

#: (summary metric, column title) of the scores table, in order.
SCORE_COLUMNS = (
    ("judge_accuracy", "judge (strict)"),
    ("judge_accuracy_audited", "judge, audited gold"),
    ("f1_official", "F1 (LoCoMo)"),
    ("f1", "F1 (mem0)"),
    ("f1_audited", "F1 (mem0), audited gold"),
    ("bleu1", "BLEU-1"),
    ("evidence_recall", "evidence recall"),
)
#: (summary metric, column title) of the paired-differences table.
PAIRED_COLUMNS = (
    ("judge_accuracy", "judge (strict)"),
    ("f1_official", "F1 (LoCoMo)"),
    ("evidence_recall", "evidence recall"),
)


#: The paper's claims the study tests: (claim, the paper's figures, what is claimed of the paired
#: judge difference, system, baseline). "gain": the system beats the baseline; "within 1 point":
#: the system loses at most a point against it.
CLAIMS = (
    (
        "the hybrid beats episodes alone",
        "over the stronger single store: single-hop +3.6, multi-hop +2.5, open-domain +1.0, temporal +3.4",
        "gain",
        "hybrid",
        "episodic-only",
    ),
    (
        "the hybrid beats tuples alone",
        "as above",
        "gain",
        "hybrid",
        "relational-only",
    ),
    (
        "consolidation costs about 1 point",
        "mcs 5–20 within 1 point (89.2–89.8 against 90.2); mcs 5–10 compress 16–22%",
        "within 1 point",
        "hybrid+consolidation",
        "hybrid",
    ),
    (
        "as above, at mcs 5",
        "as above",
        "within 1 point",
        "hybrid+consolidation@mcs5",
        "hybrid",
    ),
    (
        "memories do about as well as the raw conversation",
        "90.2 against full context's 91.3 with 87% fewer tokens",
        "within 1 point",
        "hybrid",
        "rag",
    ),
)


#: The categories where the paper finds the hybrid's gains largest, shown in every claim's row.
CLAIMED_CATEGORIES = ("multi-hop", "temporal")


def _verdict(claim: str, interval: list[float]) -> str:
    """What the paired interval says of the claim: it holds, it does not, or the sample cannot tell."""
    low, high = interval
    if claim == "gain":
        return "holds" if low > 0 else "does not hold" if high < 0 else "not decided"
    return "holds" if low >= -0.01 else "does not hold" if high < -0.01 else "not decided"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join([_row(header), "|" + "---|" * len(header), *(_row(r) for r in rows)])


def _label(label: str, entry: dict[str, Any]) -> str:
    """A system's name; the config's own consolidation setting named, as the swept one is."""
    return f"{label} (mcs {entry['mcs']})" if entry.get("mcs") and "@mcs" not in label else label


def _rate(value: float | None, interval: list[float] | None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" + ("" if interval is None else f" ({100 * interval[0]:.0f}–{100 * interval[1]:.0f})")


def _amount(value: float | None, interval: list[float] | None, lone: str = "") -> str:
    """A count or a time with its interval; ``lone`` said instead where there is none."""
    if value is None:
        return "–"
    if interval is None:
        return f"{value:.0f} {lone}".rstrip()
    return f"{value:.0f} ({interval[0]:.0f}–{interval[1]:.0f})"


def _difference(value: float, interval: list[float]) -> str:
    return f"{100 * value:+.1f} ({100 * interval[0]:+.1f} to {100 * interval[1]:+.1f})"


def _decided(value: float, interval: list[float]) -> str:
    """A difference, bold when its interval leaves out 0."""
    text = _difference(value, interval)
    return f"**{text}**" if interval[0] > 0 or interval[1] < 0 else text


def claims_table(summary: dict[str, Any]) -> str:
    """The paper's claims beside the study's paired judge differences and what those decide."""
    found = {(d["system"], d["baseline"]): d for d in summary["differences"] if d["metric"] == "judge_accuracy"}
    overall = {label: entry["overall"] for label, entry in summary["systems"].items()}
    compression = {c["mcs"]: c["compression_pct"] for c in summary.get("consolidation", {}).values()}
    rows = []
    for claim, paper, claimed, system, baseline in CLAIMS:
        d = found[(system, baseline)]
        measured = f"{system} − {baseline} {_difference(d['difference'], d['ci95'])}"
        measured += "".join(
            f"; {category} {_difference(c['difference'], c['ci95'])}"
            for category in CLAIMED_CATEGORIES
            if (c := d.get("by_category", {}).get(category)) and c["ci95"] is not None
        )
        mcs = summary["systems"][system].get("mcs")
        if mcs in compression:
            measured += f"; {compression[mcs]:.1f}% compression at mcs {mcs}"
        if baseline == "rag":
            tokens = overall[system]["context_tokens_mean"], overall[baseline]["context_tokens_mean"]
            measured += f"; {tokens[0]:,.0f} context tokens against rag's {tokens[1]:,.0f} of raw turns"
        rows.append([claim, paper, measured, _verdict(claimed, d["ci95"])])
    counts = summary["counts"]
    header = [
        "the paper's claim",
        "the paper (gpt-4.1-mini, judge)",
        f"measured here (1.5B, strict judge, {counts['questions']} questions of {counts['conversations']} "
        "conversations; paired 95% interval, points)",
        "verdict here",
    ]
    return _table(header, rows)


def scores_table(summary: dict[str, Any]) -> str:
    rows = []
    for label, entry in summary["systems"].items():
        overall = entry["overall"]
        cost = summary["cost"].get("answering", {}).get(label)
        rows.append(
            [
                _label(label, entry),
                *(_rate(overall.get(name), overall["ci95"].get(name)) for name, _ in SCORE_COLUMNS),
                _amount(overall.get("context_tokens_mean"), overall["ci95"].get("context_tokens_mean")),
                "–" if cost is None else _amount(cost["s_per_answer"], cost["ci95"], lone="(one run)"),
            ]
        )
    return _table(["system", *(title for _, title in SCORE_COLUMNS), "context tok", "s per answer"], rows)


def paired_table(summary: dict[str, Any]) -> str:
    found = {(d["system"], d["baseline"], d["metric"]): d for d in summary["differences"]}
    pairs = list(dict.fromkeys((d["system"], d["baseline"]) for d in summary["differences"]))
    rows = []
    for system, baseline in pairs:
        cells = []
        for metric, _ in PAIRED_COLUMNS:
            d = found.get((system, baseline, metric))
            cells.append("–" if d is None or d["ci95"] is None else _decided(d["difference"], d["ci95"]))
        rows.append([f"{system} − {baseline}", *cells])
    return _table(["system − baseline", *(title for _, title in PAIRED_COLUMNS)], rows)


def category_table(summary: dict[str, Any]) -> str:
    """The paired judge differences per LoCoMo category, bold where decided, with the questions."""
    judged = [d for d in summary["differences"] if d["metric"] == "judge_accuracy"]
    categories = list(dict.fromkeys(c for d in judged for c in d.get("by_category", {})))
    rows = []
    for d in judged:
        cells = []
        for category in categories:
            c = d.get("by_category", {}).get(category)
            cells.append(
                "–" if c is None or c["ci95"] is None else f"{_decided(c['difference'], c['ci95'])} [{c['n']}]"
            )
        rows.append([f"{d['system']} − {d['baseline']}", *cells])
    return _table(["system − baseline (judge)", *categories], rows)


def date_format_table(summary: dict[str, Any], date_format: dict[str, Any]) -> str:
    def figure(block: dict[str, Any]) -> str:
        return _rate(block["mean"], block["ci95"])

    rows = []
    for label, figures in date_format["systems"].items():
        temporal, overall = figures["temporal"], figures["overall"]
        rows.append(
            [
                _label(label, summary["systems"].get(label, {})),
                figure(temporal["as_answered"]),
                figure(temporal["dates_in_words"]),
                figure(overall["as_answered"]),
                figure(overall["dates_in_words"]),
                _difference(overall["difference"]["difference"], overall["difference"]["ci95"]),
            ]
        )
    header = [
        "system",
        "temporal F1 as answered",
        "temporal F1, dates in words",
        "F1 as answered",
        "F1, dates in words",
        "change in F1 (paired)",
    ]
    return _table(header, rows)


def tables(study: Path) -> dict[str, str]:
    summary = json.loads((study / "summary.json").read_text(encoding="utf-8"))
    date_format = json.loads((study / "date_format.json").read_text(encoding="utf-8"))
    return {
        "claims": claims_table(summary),
        "scores": scores_table(summary),
        "paired differences": paired_table(summary),
        "paired judge differences by category": category_table(summary),
        "dates in words": date_format_table(summary, date_format),
    }


def write(document: Path, drawn: dict[str, str]) -> None:
    """Replace each of the document's tables with the drawn one whose first two column titles it
    shares (a later title may hold counts that change as shards land)."""
    lines = document.read_text(encoding="utf-8").split("\n")
    for name, table in drawn.items():
        titles = " | ".join(table.split(" | ")[:2]) + " | "
        starts = [i for i, line in enumerate(lines) if line.startswith(titles)]
        if len(starts) != 1:
            raise SystemExit(f"{document}: {len(starts)} tables start with {titles!r} (the {name} table); expected 1")
        end = starts[0]
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[starts[0] : end] = table.split("\n")
    document.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=STUDY, help="the study folder (default: %(default)s)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", type=Path, help="a document that must hold every table verbatim")
    action.add_argument("--write", type=Path, help="a document whose tables are replaced by the drawn ones")
    args = parser.parse_args(argv)
    drawn = tables(args.study)
    if args.write is not None:
        write(args.write, drawn)
        return 0
    if args.check is None:
        print("\n\n".join(drawn.values()))
        return 0
    document = args.check.read_text(encoding="utf-8")
    stale = [name for name, table in drawn.items() if table not in document]
    for name in stale:
        print(f"{args.check}: its {name} table is not the one the records give; paste this:\n\n{drawn[name]}\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
