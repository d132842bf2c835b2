"""Relative-date annotation: a table of expressions against session dates, worked out by hand."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest

from hybridmem_local.curation.dates import annotate_relative_dates

MONDAY = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)  # LoCoMo conv-26, session 1
NEW_YEAR_SUNDAY = datetime(2023, 1, 1, 10, 0, tzinfo=timezone.utc)
MONTH_END = datetime(2023, 3, 31, 9, 0, tzinfo=timezone.utc)  # a Friday
AUTUMN = datetime(2023, 10, 15, 12, 0, tzinfo=timezone.utc)

CASES = [
    # (session date, expression, annotation)
    (MONDAY, "yesterday", "[2023-05-07]"),
    (MONDAY, "today", "[2023-05-08]"),
    (MONDAY, "tonight", "[2023-05-08]"),
    (MONDAY, "this morning", "[2023-05-08]"),
    (MONDAY, "last night", "[2023-05-07]"),
    (MONDAY, "the day before yesterday", "[2023-05-06]"),
    (MONDAY, "tomorrow", "[2023-05-09]"),
    (MONDAY, "the day after tomorrow", "[2023-05-10]"),
    (MONDAY, "3 days ago", "[2023-05-05]"),
    (MONDAY, "three days ago", "[2023-05-05]"),
    (MONDAY, "a few days ago", "[~2023-05-05]"),
    (MONDAY, "a couple of days ago", "[~2023-05-06]"),
    (MONDAY, "the other day", "[~2023-05-05]"),
    (MONDAY, "last week", "[week of 2023-05-01]"),
    (MONDAY, "this week", "[week of 2023-05-08]"),
    (MONDAY, "next week", "[week of 2023-05-15]"),
    (MONDAY, "a week ago", "[week of 2023-05-01]"),
    (MONDAY, "two weeks ago", "[week of 2023-04-24]"),
    (MONDAY, "a few weeks ago", "[~week of 2023-04-17]"),
    (MONDAY, "in two weeks", "[week of 2023-05-22]"),
    (MONDAY, "last weekend", "[weekend of 2023-05-06]"),
    (MONDAY, "this weekend", "[weekend of 2023-05-13]"),
    (MONDAY, "two weekends ago", "[weekend of 2023-04-29]"),
    (MONDAY, "last month", "[2023-04]"),
    (MONDAY, "next month", "[2023-06]"),
    (MONDAY, "two months ago", "[2023-03]"),
    (MONDAY, "last year", "[2022]"),
    (MONDAY, "five years ago", "[2018]"),
    (MONDAY, "a few years ago", "[~2020]"),
    (MONDAY, "last Friday", "[2023-05-05]"),
    (MONDAY, "last Fri", "[2023-05-05]"),
    (MONDAY, "last Monday", "[2023-05-01]"),  # said on a Monday: the one a week before
    (MONDAY, "this Sunday", "[2023-05-14]"),
    (MONDAY, "next Tuesday", "[2023-05-16]"),
    (MONDAY, "last summer", "[summer 2022]"),
    (MONDAY, "this winter", "[winter 2023/24]"),
    (NEW_YEAR_SUNDAY, "yesterday", "[2022-12-31]"),
    (NEW_YEAR_SUNDAY, "last week", "[week of 2022-12-19]"),
    (NEW_YEAR_SUNDAY, "last weekend", "[weekend of 2022-12-24]"),
    (NEW_YEAR_SUNDAY, "last month", "[2022-12]"),
    (NEW_YEAR_SUNDAY, "last winter", "[winter 2021/22]"),
    (NEW_YEAR_SUNDAY, "this winter", "[winter 2022/23]"),
    (MONTH_END, "last month", "[2023-02]"),
    (MONTH_END, "next month", "[2023-04]"),
    (MONTH_END, "last Friday", "[2023-03-24]"),
    (AUTUMN, "last summer", "[summer 2023]"),
    (AUTUMN, "next spring", "[spring 2024]"),
]


@pytest.mark.parametrize(("reference", "expression", "annotation"), CASES)
def test_expression_is_annotated_with_its_date(reference, expression, annotation):
    text = f"We talked about it {expression}, remember?"
    assert annotate_relative_dates(text, reference) == f"We talked about it {expression} {annotation}, remember?"


@pytest.mark.parametrize(
    "text",
    [
        "We met in 2022 in Boston.",  # already absolute
        "Last time we talked you were in Paris.",
        "This is the best painting so far.",
        "What are the next steps?",
        "I have been busy recently.",
        "We yesterdays-ago nothing",  # no whole-word expression
    ],
)
def test_text_without_relative_dates_is_unchanged(text):
    assert annotate_relative_dates(text, MONDAY) == text


def test_several_expressions_keep_their_case_and_order():
    text = "Yesterday I ran; the day before yesterday I swam, and Last Week's race was hard."
    assert annotate_relative_dates(text, MONDAY) == (
        "Yesterday [2023-05-07] I ran; the day before yesterday [2023-05-06] I swam, "
        "and Last Week's [week of 2023-05-01] race was hard."
    )


def test_annotating_twice_changes_nothing():
    once = annotate_relative_dates("I went yesterday and will go next month.", MONDAY)
    assert annotate_relative_dates(once, MONDAY) == once


def test_the_speakers_local_date_is_used():
    # 00:30 on 9 May in Tokyo is still 8 May in UTC; the speaker's "yesterday" is 8 May.
    tokyo = timezone(timedelta(hours=9))
    assert annotate_relative_dates("yesterday", datetime(2023, 5, 9, 0, 30, tzinfo=tokyo)) == "yesterday [2023-05-08]"


def test_a_plain_date_works_as_reference():
    assert annotate_relative_dates("tomorrow", date(2024, 2, 28)) == "tomorrow [2024-02-29]"
