"""scripts/study_tables.py: docs/benchmarks.md §15 holds the tables the study's records give."""

from __future__ import annotations

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


def test_a_difference_is_bold_exactly_when_its_interval_leaves_out_zero(study_tables):
    paired = study_tables.tables(study_tables.STUDY)["paired differences"]
    cells = [cell for line in paired.splitlines()[2:] for cell in line.strip("|").split(" | ")[1:]]
    assert cells
    for cell in (c.strip() for c in cells):
        low, high = (float(end) for end in cell.strip("*").split("(")[1].rstrip(")").split(" to "))
        assert cell.startswith("**") == (low > 0 or high < 0), cell
