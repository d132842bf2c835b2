"""scripts/study_tables.py: docs/benchmarks.md §15 holds the tables the study's records give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import load_script

REPO = Path(__file__).resolve().parents[2]
DOCUMENT = REPO / "docs/benchmarks.md"


@pytest.fixture(scope="module")
def study_tables():
    return load_script("study_tables")


def test_the_benchmarks_document_holds_the_study_s_tables(study_tables, capsys):
    assert study_tables.main(["--check", str(DOCUMENT)]) == 0, capsys.readouterr().out


def test_a_figure_the_records_do_not_give_is_named_with_its_table(study_tables, tmp_path, capsys):
    drawn = study_tables.tables(study_tables.STUDY)
    paired = drawn["paired differences"]
    row = next(line for line in paired.splitlines() if line.startswith("| hybrid − rag |"))
    figure = row.split(" | ")[1]
    stale = tmp_path / "benchmarks.md"
    stale.write_text(DOCUMENT.read_text(encoding="utf-8").replace(row, row.replace(figure, "+1.0 (-1.0 to +3.0)")))
    assert study_tables.main(["--check", str(stale)]) == 1
    out = capsys.readouterr().out
    assert "its paired differences table is not the one the records give" in out and row in out
    assert "its scores table" not in out and "its dates in words table" not in out
    assert study_tables.main(["--write", str(stale)]) == 0
    assert study_tables.main(["--check", str(stale)]) == 0, capsys.readouterr().out
    assert stale.read_text(encoding="utf-8") == DOCUMENT.read_text(encoding="utf-8")


def test_a_difference_is_bold_exactly_when_its_interval_leaves_out_zero(study_tables):
    paired = study_tables.tables(study_tables.STUDY)["paired differences"]
    cells = [cell for line in paired.splitlines()[2:] for cell in line.strip("|").split(" | ")[1:]]
    assert cells
    for cell in (c.strip() for c in cells):
        low, high = (float(end) for end in cell.strip("*").split("(")[1].rstrip(")").split(" to "))
        assert cell.startswith("**") == (low > 0 or high < 0), cell


@pytest.mark.parametrize(
    ("claim", "pair", "interval", "verdict"),
    [
        ("the hybrid beats episodes alone", ("hybrid", "episodic-only"), [0.001, 0.05], "holds"),
        ("the hybrid beats episodes alone", ("hybrid", "episodic-only"), [-0.02, 0.03], "not decided"),
        ("the hybrid beats episodes alone", ("hybrid", "episodic-only"), [-0.05, -0.001], "does not hold"),
        ("memories do about as well as the raw conversation", ("hybrid", "rag"), [-0.009, 0.02], "holds"),
        ("memories do about as well as the raw conversation", ("hybrid", "rag"), [-0.03, 0.0], "not decided"),
        ("memories do about as well as the raw conversation", ("hybrid", "rag"), [-0.05, -0.011], "does not hold"),
    ],
)
def test_a_claim_s_verdict_is_what_its_paired_judge_interval_decides(study_tables, claim, pair, interval, verdict):
    summary = json.loads((study_tables.STUDY / "summary.json").read_text(encoding="utf-8"))
    judged = next(
        d for d in summary["differences"] if (d["system"], d["baseline"], d["metric"]) == (*pair, "judge_accuracy")
    )
    judged["ci95"] = interval
    row = next(line for line in study_tables.claims_table(summary).splitlines() if line.startswith(f"| {claim} |"))
    assert row.endswith(f"| {verdict} |"), row
    assert f"{pair[0]} − {pair[1]} " in row


def test_writing_a_document_that_lacks_a_table_names_it_and_changes_nothing(study_tables, tmp_path):
    claims = study_tables.tables(study_tables.STUDY)["claims"]
    lacking = tmp_path / "benchmarks.md"
    text = DOCUMENT.read_text(encoding="utf-8").replace(claims, "")
    lacking.write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit, match="0 tables start with .*the claims table"):
        study_tables.main(["--write", str(lacking)])
    assert lacking.read_text(encoding="utf-8") == text
