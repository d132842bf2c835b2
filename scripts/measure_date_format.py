"""How much of the study's F1 is lost to the way answers write dates (docs/benchmarks.md §15).

    PYTHONPATH=$PWD .venv/bin/python scripts/measure_date_format.py
    PYTHONPATH=$PWD .venv/bin/python scripts/measure_date_format.py --study DIR --out PATH

The answers copy dates as the memories show them, in ISO form ("2023-07-05"); LoCoMo's gold
writes them in words ("5 July 2023", "July, 2023"). The official normaliser strips the hyphens,
so "2023-07-05" becomes the one token "20230705", which matches nothing: a right date scores 0.

This rescores every shard's committed predictions (the records of each shard's latest run, as
``hybridmem eval report`` reads them) with the official F1 twice: as answered, and with each ISO
date of the answer written the way the gold writes dates ("2023-07-05" → "5 July 2023",
"2023-07" → "July 2023"). Nothing else of the answer changes, so the difference is the format
alone. It prints, per system, temporal and overall F1 both ways with 95% intervals and the paired
difference; ``--out`` gets the same figures as JSON. A wrong date written in words can share its
month or year with the gold and earn part of a point, as any answer in words already does: the
rescored figure is what the official F1 would give these answers had they used the gold's format,
not a better metric. Only the judge columns of the study are free of this; it is reported beside
them, not in place of the official F1.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import date
from pathlib import Path

from hybridmem_local.eval.locomo import CATEGORY_NAMES
from hybridmem_local.eval.metrics import aggregate, f1_official, paired_difference, score_interval
from hybridmem_local.eval.shards import Shard, shard_folders

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "docs/results/locomo-study"
_ISO_DAY = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_ISO_MONTH = re.compile(r"\b(\d{4})-(\d{2})\b(?!-\d)")
CATEGORY_NUMBERS = {name: number for number, name in CATEGORY_NAMES.items()}


def _day_in_words(match: re.Match[str]) -> str:
    try:
        day = date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return match[0]  # not a calendar date: left as written
    return f"{day.day} {day:%B} {day.year}"


def _month_in_words(match: re.Match[str]) -> str:
    month = int(match[2])
    return f"{date(2000, month, 1):%B} {match[1]}" if 1 <= month <= 12 else match[0]


def dates_in_words(answer: str) -> str:
    """``answer`` with each ISO date (day or month) written as LoCoMo's gold writes dates."""
    return _ISO_MONTH.sub(_month_in_words, _ISO_DAY.sub(_day_in_words, answer))


def has_iso_date(answer: str) -> bool:
    return bool(_ISO_DAY.search(answer) or _ISO_MONTH.search(answer))


def _scores(records: list[dict]) -> tuple[list[float | None], list[float | None]]:
    """Official F1 of each record as answered and with its dates in words."""
    as_answered: list[float | None] = []
    in_words: list[float | None] = []
    for record in records:
        stored = record["metrics"].get("f1_official")
        prediction = record.get("prediction")
        if stored is None or prediction is None:
            as_answered.append(None)
            in_words.append(None)
            continue
        category = CATEGORY_NUMBERS[record["category"]]
        recomputed = f1_official(prediction, record["gold"], category)
        if abs(recomputed - stored) > 1e-9:
            raise SystemExit(
                f"{record['question_id']} ({record['system']}): F1 {recomputed} differs from the record's {stored}"
            )
        as_answered.append(stored)
        in_words.append(f1_official(dates_in_words(prediction), record["gold"], category))
    return as_answered, in_words


def _figure(values: list[float | None]) -> dict:
    summary = aggregate(values).overall
    interval = score_interval(values)
    return {"n": summary.count, "mean": summary.mean, "ci95": None if interval is None else list(interval)}


def measure(study: Path) -> dict:
    shards = [Shard(folder) for folder in shard_folders(study)]
    if not shards:
        raise SystemExit(f"{study}: no shard folders under {study / 'shards'}")
    records = [r for shard in shards for r in shard.records]
    systems: dict[str, dict] = {}
    for label in dict.fromkeys(r["system"] for r in records):
        mine = [r for r in records if r["system"] == label]
        systems[label] = {}
        for scope, chosen in (("temporal", [r for r in mine if r["category"] == "temporal"]), ("overall", mine)):
            as_answered, in_words = _scores(chosen)
            change = paired_difference(in_words, as_answered)
            systems[label][scope] = {
                "as_answered": _figure(as_answered),
                "dates_in_words": _figure(in_words),
                "difference": change.model_dump(),
                "answers_with_iso_dates": sum(has_iso_date(r.get("prediction") or "") for r in chosen),
            }
    return {"shards": [shard.folder.name for shard in shards], "systems": systems}


def _points(figure: dict) -> str:
    if figure["mean"] is None:
        return "—"
    low, high = figure["ci95"]
    return f"{100 * figure['mean']:.1f} ({100 * low:.0f}–{100 * high:.0f})"


def _change(difference: dict) -> str:
    if difference["difference"] is None:
        return "—"
    low, high = difference["ci95"]
    return f"{100 * difference['difference']:+.1f} ({100 * low:+.1f} to {100 * high:+.1f})"


def table(result: dict) -> str:
    lines = [
        f"shards: {', '.join(result['shards'])}",
        "",
        "| system | temporal F1 as answered | temporal F1, dates in words | change | "
        "F1 as answered | F1, dates in words | change | answers with ISO dates |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, scopes in result["systems"].items():
        temporal, overall = scopes["temporal"], scopes["overall"]
        lines.append(
            f"| {label} | {_points(temporal['as_answered'])} | {_points(temporal['dates_in_words'])} | "
            f"{_change(temporal['difference'])} | {_points(overall['as_answered'])} | "
            f"{_points(overall['dates_in_words'])} | {_change(overall['difference'])} | "
            f"{overall['answers_with_iso_dates']} of {overall['as_answered']['n']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, default=STUDY, help="the study folder (holds shards/)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    result = measure(args.study)
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
