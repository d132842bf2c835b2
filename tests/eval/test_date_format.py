"""scripts/measure_date_format.py: the study's F1 rescored with the answers' ISO dates in words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import load_script

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "docs/results/locomo-study"


@pytest.fixture(scope="module")
def date_format():
    return load_script("measure_date_format")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("2023-07-05", "5 July 2023"),
        ("On 2023-07-05, then 2023-08", "On 5 July 2023, then August 2023"),
        ("The week before 2023-06-09", "The week before 9 June 2023"),
        ("2023-02-30 and 2023-13", "2023-02-30 and 2023-13"),  # not calendar dates: left alone
        ("in 2022, 10-12 people", "in 2022, 10-12 people"),
    ],
)
def test_iso_dates_are_written_as_the_gold_writes_them(date_format, answer, expected):
    assert date_format.dates_in_words(answer) == expected


def test_a_right_iso_date_scores_once_written_in_words(date_format):
    from hybridmem_local.eval.metrics import f1_official

    assert f1_official("2023-07-05", "5 July 2023", 2) == 0.0
    assert f1_official(date_format.dates_in_words("2023-07-05"), "5 July 2023", 2) == 1.0


def test_the_committed_study_rescored(date_format, tmp_path):
    if not (STUDY / "shards").is_dir():
        pytest.skip(f"no committed study shards under {STUDY}")
    out = tmp_path / "date_format.json"
    assert date_format.main(["--study", str(STUDY), "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    summary = json.loads((STUDY / "summary.json").read_text(encoding="utf-8"))
    assert set(result["systems"]) == set(summary["systems"])
    for label, scopes in result["systems"].items():
        reported = summary["systems"][label]
        # As answered, it is exactly the report's official F1: the same records, the same scorer.
        assert scopes["overall"]["as_answered"]["mean"] == pytest.approx(reported["overall"]["f1_official"])
        temporal = reported["by_category"]["temporal"]["f1_official"]
        assert scopes["temporal"]["as_answered"]["mean"] == pytest.approx(temporal)
        # What docs/benchmarks.md §15 says of these records: the rewrite raises temporal F1.
        assert scopes["temporal"]["dates_in_words"]["mean"] > scopes["temporal"]["as_answered"]["mean"]
        assert scopes["overall"]["answers_with_iso_dates"] > 0


def test_only_answers_holding_an_iso_date_are_rewritten(date_format):
    from hybridmem_local.eval.shards import Shard, shard_folders

    folders = shard_folders(STUDY)
    if not folders:
        pytest.skip(f"no committed study shards under {STUDY}")
    answers = [r["prediction"] for folder in folders for r in Shard(folder).records if r.get("prediction")]
    rewritten = [a for a in answers if date_format.dates_in_words(a) != a]
    assert rewritten
    assert all(date_format.has_iso_date(a) for a in rewritten)
