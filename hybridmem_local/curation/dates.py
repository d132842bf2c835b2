"""Relative dates made absolute before an LLM reads a turn.

Small curation models do not reliably turn "yesterday" into a date, so each relative
expression is annotated in place with the date it denotes, computed from the session date:

    >>> annotate_relative_dates("I went there yesterday.", datetime(2023, 5, 8))
    'I went there yesterday [2023-05-07].'

The design is a table: a :class:`Unit` says how to step a reference date by ``n`` units and
how to label the result (day → ``2023-05-07``, week → ``week of 2023-05-01``, month →
``2023-05``, year → ``2023``), and each :class:`Rule` is a regex plus a small function that
reads ``(unit, n, approximate)`` off a match. Vague counts ("a few days ago", "the other day")
are marked approximate with ``~``. Absolute dates ("in 2022") match no rule and stay as they
are. Text that is already annotated is left alone, so annotating twice changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from dateutil.relativedelta import relativedelta

# --------------------------------------------------------------------------- units


def _monday(day: date) -> date:
    return day - timedelta(days=day.weekday())


@dataclass(frozen=True)
class Unit:
    #: ``shift(reference, n)``: the date ``n`` units away from ``reference`` (0 = the current one).
    shift: Callable[[date, int], date]
    label: Callable[[date], str]


UNITS: dict[str, Unit] = {
    "day": Unit(lambda ref, n: ref + timedelta(days=n), lambda d: d.isoformat()),
    # Weeks start on Monday; "last week" is the whole previous week, labelled by its Monday.
    "week": Unit(lambda ref, n: _monday(ref) + timedelta(weeks=n), lambda d: f"week of {d.isoformat()}"),
    # A weekend is labelled by its Saturday; "this weekend" is the one of the current week.
    "weekend": Unit(lambda ref, n: _monday(ref) + timedelta(days=5, weeks=n), lambda d: f"weekend of {d.isoformat()}"),
    "month": Unit(lambda ref, n: ref + relativedelta(months=n), lambda d: f"{d:%Y-%m}"),
    "year": Unit(lambda ref, n: ref + relativedelta(years=n), lambda d: f"{d:%Y}"),
}

#: Count words → (number, approximate).
COUNTS: dict[str, tuple[int, bool]] = {
    **{
        w: (i, False)
        for i, w in enumerate(
            ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"], start=1
        )
    },
    "a": (1, False),
    "an": (1, False),
    "a couple of": (2, True),
    "a couple": (2, True),
    "couple of": (2, True),
    "a few": (3, True),
    "few": (3, True),
    "several": (3, True),
}

WEEKDAYS: dict[str, int] = {
    **{
        name: i for i, name in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"))
    },
    # Short forms that are not also common words ("sat", "sun" are left out).
    "mon": 0,
    "tue": 1,
    "tues": 1,
    "wed": 2,
    "thu": 3,
    "thur": 3,
    "thurs": 3,
    "fri": 4,
}

#: Month a season starts in (northern hemisphere); it lasts three months.
SEASONS: dict[str, int] = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}

#: Fixed expressions → (unit, n, approximate).
FIXED: dict[str, tuple[str, int, bool]] = {
    "today": ("day", 0, False),
    "tonight": ("day", 0, False),
    "this morning": ("day", 0, False),
    "this afternoon": ("day", 0, False),
    "this evening": ("day", 0, False),
    "yesterday": ("day", -1, False),
    "last night": ("day", -1, False),
    "the day before yesterday": ("day", -2, False),
    "tomorrow": ("day", 1, False),
    "the day after tomorrow": ("day", 2, False),
    "the other day": ("day", -3, True),
}

DIRECTIONS: dict[str, int] = {"last": -1, "this": 0, "next": 1}


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Resolved:
    label: str
    approximate: bool = False

    def annotation(self) -> str:
        return f"[{'~' if self.approximate else ''}{self.label}]"


def _alternation(words) -> str:
    # Longest first, so "a couple of" wins over "a".
    return "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in sorted(words, key=len, reverse=True))


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _in_units(unit: str, n: int, approximate: bool, ref: date) -> Resolved:
    unit = unit.lower().rstrip("s")
    return Resolved(UNITS[unit].label(UNITS[unit].shift(ref, n)), approximate)


def _fixed(m: re.Match, ref: date) -> Resolved:
    unit, n, approximate = FIXED[_norm(m["phrase"])]
    return _in_units(unit, n, approximate, ref)


def _direction_unit(m: re.Match, ref: date) -> Resolved:
    return _in_units(m["unit"], DIRECTIONS[m["direction"].lower()], False, ref)


def _count_ago(m: re.Match, ref: date) -> Resolved:
    n, approximate = _count(m["count"])
    return _in_units(m["unit"], -n, approximate, ref)


def _count_ahead(m: re.Match, ref: date) -> Resolved:
    n, approximate = _count(m["count"])
    return _in_units(m["unit"], n, approximate, ref)


def _count(word: str) -> tuple[int, bool]:
    word = _norm(word)
    return (int(word), False) if word.isdigit() else COUNTS[word]


def _weekday(m: re.Match, ref: date) -> Resolved:
    target = WEEKDAYS[m["weekday"].lower()]
    direction = m["direction"].lower()
    if direction == "last":  # the most recent one strictly before the reference day
        day = ref - timedelta(days=(ref.weekday() - target - 1) % 7 + 1)
    else:  # "this Friday" / "next Friday": the Friday of the current / the next week
        day = _monday(ref) + timedelta(days=target, weeks=DIRECTIONS[direction])
    return Resolved(day.isoformat())


def _season(m: re.Match, ref: date) -> Resolved:
    start_month = SEASONS[m["season"].lower()]
    starts = [date(year, start_month, 1) for year in range(ref.year - 2, ref.year + 2)]
    occurrences = [(start, start + relativedelta(months=3)) for start in starts]
    direction = m["direction"].lower()
    if direction == "last":  # the latest one that has ended
        start = max(s for s, end in occurrences if end <= ref)
    elif direction == "next":  # the earliest one still to start
        start = min(s for s, _ in occurrences if s > ref)
    else:  # the one under way, else the coming one
        start = min(s for s, end in occurrences if end > ref)
    season = m["season"].lower()
    year = f"{start.year}/{(start.year + 1) % 100:02d}" if start_month == 12 else str(start.year)
    return Resolved(f"{season} {year}")


_UNIT = r"(?P<unit>day|week|weekend|month|year)s?"
_COUNT = rf"(?P<count>\d{{1,3}}|{_alternation(COUNTS)})"


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern
    resolve: Callable[[re.Match, date], Resolved]


def _rule(pattern: str, resolve: Callable[[re.Match, date], Resolved]) -> Rule:
    # Whole words only; an optional possessive stays inside the span ("last week's [...]").
    return Rule(re.compile(rf"\b(?:{pattern})\b(?:'s|’s)?", re.IGNORECASE), resolve)


RULES: list[Rule] = [
    _rule(rf"(?P<phrase>{_alternation(FIXED)})", _fixed),
    _rule(r"(?P<direction>last|this|next)\s+(?:(?P<unit>week|weekend|month|year))", _direction_unit),
    _rule(rf"{_COUNT}\s+{_UNIT}\s+ago", _count_ago),
    _rule(rf"in\s+{_COUNT}\s+{_UNIT}", _count_ahead),
    _rule(rf"(?P<direction>last|this|next)\s+(?P<weekday>{_alternation(WEEKDAYS)})", _weekday),
    _rule(rf"(?P<direction>last|this|next)\s+(?P<season>{_alternation(SEASONS)})", _season),
]

#: A match already followed by an annotation is skipped (annotating is idempotent).
_ANNOTATED = re.compile(r"\s*\[")


def annotate_relative_dates(text: str, reference: datetime | date) -> str:
    """Append ``[absolute date]`` after each relative time expression in ``text``.

    ``reference`` is the moment the text was said (the session date). Overlapping matches
    keep the earliest, then the longest ("the day before yesterday" over "yesterday").
    """
    ref = reference.date() if isinstance(reference, datetime) else reference
    matches = [(m, rule) for rule in RULES for m in rule.pattern.finditer(text)]
    matches.sort(key=lambda pair: (pair[0].start(), -pair[0].end()))
    out: list[str] = []
    position = 0
    for match, rule in matches:
        if match.start() < position or _ANNOTATED.match(text, match.end()):
            continue
        out.append(text[position : match.end()])
        out.append(" " + rule.resolve(match, ref).annotation())
        position = match.end()
    out.append(text[position:])
    return "".join(out)
