"""What the curation LLM writes and how a reply is checked before it becomes memories.

:class:`CurationReply` is the constrained-JSON schema of one window's reply (``reply_schema``
caps its lists); :func:`check_curation_reply` keeps the cited ids that name turns of the window,
gives every memory a real date and leaves out memories with no content or not from the window.
The windows and the batched calls that produce these replies are ``curator.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from functools import cache
from typing import Any

from dateutil import parser as date_parser
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.config import JsonDict

from hybridmem_local.curation.redaction import ForgetRequest
from hybridmem_local.schema import TURN_REFERENCE, EpisodeDraft, TupleDraft, clean_cited_id
from hybridmem_local.text.stems import tokenize

# Constraints that only the JSON schema carries (constrained decoding obeys them; validation
# stays lenient). Timestamps are held to ISO form, so a constrained model cannot write "last
# week"; an impossible date (2023-02-30) or a server that ignores schemas is handled by
# :func:`normalise_timestamp`, which falls back to the session date instead of failing the
# window. String lengths and list sizes are capped because small models loop inside a string,
# or repeat list items, until max_new_tokens; the caps are generous for real memories (the
# grammar engines, llguidance in-process and vLLM's, build nothing that grows with them).
_ISO_DATE: JsonDict = {"pattern": r"^\d{4}(-\d{2}(-\d{2})?)?$"}
#: A memory cites a few turns; 40 characters fit LoCoMo ("D12:7") and LongMemEval
#: ("answer_4be1b6b4_2:13") ids, and a longer one is dropped like any unknown id.
_TURN_IDS: JsonDict = {"maxItems": 6, "items": {"type": "string", "maxLength": 40}}
_WORD = re.compile(r"[^\W_]+")
#: A text of this many words or more that is mostly one phrase over and over is a decoding
#: loop, not a memory (real details of ~100 words keep well over half their words distinct).
_LOOP_MIN_WORDS, _LOOP_MAX_DISTINCT_SHARE = 12, 0.25
_ISO_DATE_IN_TEXT = re.compile(r"(?<!\d)(\d{4})-(\d{2})(?:-(\d{2}))?(?!\d)")
_YEAR = re.compile(r"^\s*(\d{4})\s*$")


def _text(max_chars: int) -> Any:  # what Field() returns: typed Any so it can default any attribute
    return Field(min_length=1, json_schema_extra={"maxLength": max_chars})


# --------------------------------------------------------------------------- LLM reply schema


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EpisodeReply(_Reply):
    title: str = _text(80)
    summary: str = _text(200)
    details: str = _text(600)
    timestamp: str = Field(description="YYYY-MM-DD", json_schema_extra=_ISO_DATE)
    source_turn_ids: list[str] = Field(json_schema_extra=_TURN_IDS)


class TupleReply(_Reply):
    entity: str = _text(60)
    relation: str = _text(60)
    object: str = _text(120)
    timestamp: str = Field(description="YYYY-MM-DD", json_schema_extra=_ISO_DATE)
    context: str = Field(json_schema_extra={"maxLength": 200})
    source_turn_ids: list[str] = Field(json_schema_extra=_TURN_IDS)


class ForgetRequestReply(_Reply):
    """The user asking to forget something they said (curation/redaction.py plans what it names)."""

    what: str = _text(80)
    turn_id: str = Field(json_schema_extra={"maxLength": 40})


class CurationReply(_Reply):
    """What the curation LLM writes; checked and turned into a :class:`CurationResult`."""

    episodes: list[EpisodeReply]
    tuples: list[TupleReply]
    #: Optional: most sessions ask nothing, and a small model fills fewer fields better.
    forget_requests: list[ForgetRequestReply] = Field(default_factory=list, json_schema_extra={"maxItems": 2})


@cache
def reply_schema(max_episodes: int, max_tuples: int) -> type[CurationReply]:
    """:class:`CurationReply` with list sizes capped in its JSON schema (validation stays lenient)."""
    return create_model(
        "CurationReply",
        __base__=CurationReply,
        episodes=(list[EpisodeReply], Field(json_schema_extra={"maxItems": max_episodes})),
        tuples=(list[TupleReply], Field(json_schema_extra={"maxItems": max_tuples})),
    )


#: The reply schema's own names, which small models under constrained decoding write as
#: content (SmolLM2 stored episodes titled, summarised and detailed "EpisodeReply").
_SCHEMA_NAMES = {model.__name__.lower() for model in (CurationReply, EpisodeReply, TupleReply)}


# --------------------------------------------------------------------------- checking replies


def normalise_timestamp(value: str, session_date: date) -> str | None:
    """An ISO date (YYYY, YYYY-MM or YYYY-MM-DD) for ``value``, or None when it names no date.

    The first ISO-looking date inside the value wins, so a copied annotation such as
    ``"week of 2023-05-01"`` or ``"~2023-05-05"`` gives its date; other forms ("May 7, 2023")
    go through dateutil, with the session date filling what the value leaves out.
    """
    iso, year_only = _ISO_DATE_IN_TEXT.search(value), _YEAR.match(value)
    parts = iso.groups() if iso else (year_only.group(1), None, None) if year_only else None
    if parts is not None:
        year, month, day = parts
        try:
            date(int(year), int(month or 1), int(day or 1))
        except ValueError:
            return None
        return "-".join(part for part in (year, month, day) if part)
    try:
        parsed = date_parser.parse(value, default=datetime(session_date.year, session_date.month, session_date.day))
    except (ValueError, OverflowError):
        return None
    return parsed.date().isoformat()


def content_problem(text: str) -> str | None:
    """Why ``text`` carries no memory content (only turn-id references or the reply schema's
    names, or a decoding loop), or None."""
    words = [w.lower() for w in _WORD.findall(TURN_REFERENCE.sub(" ", text))]
    if not words:
        return "only turn ids" if TURN_REFERENCE.search(text) else "empty"
    if set(words) <= _SCHEMA_NAMES:
        return "only the reply schema's name"
    if len(words) >= _LOOP_MIN_WORDS and len(set(words)) / len(words) < _LOOP_MAX_DISTINCT_SHARE:
        return "a phrase repeated in a loop"
    return None


def ungrounded(text: str, window_stems: set[str], max_share: float) -> str | None:
    """Why ``text`` is not from the window: more than ``max_share`` of its distinct word stems
    occur in none of the window's lines (a small model copying the prompt's worked example,
    or inventing), or None."""
    stems = set(tokenize([TURN_REFERENCE.sub(" ", text)])[0])
    novel = stems - window_stems
    if stems and len(novel) / len(stems) > max_share:
        return f"not in the conversation ({len(novel)} of {len(stems)} words, e.g. {sorted(novel)[0]!r})"
    return None


def episode_problem(episode: EpisodeReply) -> str | None:
    """Why an episode is no memory: no content in title, summary and details together, or a loop in one."""
    whole = content_problem(" ".join((episode.title, episode.summary, episode.details)))
    if whole is not None:
        return whole
    return next(
        (p for p in map(content_problem, (episode.summary, episode.details)) if p == "a phrase repeated in a loop"),
        None,
    )


def tuple_problem(fact: TupleReply) -> str | None:
    """Why a tuple is no memory: an empty or looping entity / relation / object, or all three the same."""
    for name in ("entity", "relation", "object"):
        problem = content_problem(getattr(fact, name))
        if problem is not None:
            return f"{name}: {problem}"
    if fact.entity.strip().lower() == fact.relation.strip().lower() == fact.object.strip().lower():
        return "entity, relation and object are the same text"
    return None


@dataclass
class CheckedReply:
    """A window's reply after checking, with what checking changed."""

    episodes: list[EpisodeDraft]
    tuples: list[TupleDraft]
    dropped_turn_ids: list[str]
    timestamps_defaulted: int
    #: Why each memory was left out (see :func:`content_problem` and :func:`ungrounded`).
    dropped_memories: list[str]
    #: Memories aligned to the window's turns (no valid cited id).
    aligned: int = 0
    forget_requests: list[ForgetRequest] = field(default_factory=list)


def check_curation_reply(
    reply: CurationReply,
    turn_ids: Sequence[str],
    session_date: date,
    window_lines: Sequence[str] = (),
    max_ungrounded_share: float = 1.0,
) -> CheckedReply:
    """Keep only cited ids among ``turn_ids``; give every memory a valid timestamp; leave out
    memories without content, and those whose words are mostly absent from ``window_lines``
    (an episode's details, a tuple's entity and object; see :func:`ungrounded`). The rest of
    the reply stays: one bad item is no reason to pay for the window again."""
    known = set(turn_ids)
    dropped: list[str] = []
    defaulted = 0
    window_stems = {stem for line in tokenize(list(window_lines)) for stem in line}

    def episode_issue(e: EpisodeReply) -> str | None:
        return episode_problem(e) or ungrounded(e.details, window_stems, max_ungrounded_share)

    def tuple_issue(t: TupleReply) -> str | None:
        return tuple_problem(t) or ungrounded(f"{t.entity} {t.object}", window_stems, max_ungrounded_share)

    problems = {id(e): f"episode {e.title[:40]!r}: {p}" for e in reply.episodes if (p := episode_issue(e))}
    problems |= {id(t): f"tuple {t.entity[:40]!r}: {p}" for t in reply.tuples if (p := tuple_issue(t))}

    def cited(ids: list[str]) -> list[str]:
        kept: list[str] = []
        for raw in ids:
            turn_id = clean_cited_id(raw)
            if turn_id in known:
                if turn_id not in kept:
                    kept.append(turn_id)
            elif raw not in dropped:
                dropped.append(raw)
        return kept

    def timestamp(value: str) -> str:
        nonlocal defaulted
        normalised = normalise_timestamp(value, session_date)
        if normalised is None:
            defaulted += 1
            return session_date.isoformat()
        return normalised

    episodes = [
        EpisodeDraft(
            title=e.title,
            summary=e.summary,
            details=e.details,
            timestamp=timestamp(e.timestamp),
            source_turn_ids=cited(e.source_turn_ids),
        )
        for e in reply.episodes
        if id(e) not in problems
    ]
    tuples = [
        TupleDraft(
            entity=t.entity,
            relation=t.relation,
            object=t.object,
            timestamp=timestamp(t.timestamp),
            context=t.context,
            source_turn_ids=cited(t.source_turn_ids),
        )
        for t in reply.tuples
        if id(t) not in problems
    ]
    requests = [r for r in map(lambda r: _placed(r, turn_ids, window_lines), reply.forget_requests) if r]
    return CheckedReply(episodes, tuples, dropped, defaulted, list(problems.values()), forget_requests=requests)


def _placed(reply: ForgetRequestReply, turn_ids: Sequence[str], lines: Sequence[str]) -> ForgetRequest | None:
    """The request on the turn it names, or on the first turn whose line holds its ``what``;
    None when neither is a turn of the window (a request copied from nowhere)."""
    turn_id = clean_cited_id(reply.turn_id)
    if turn_id not in turn_ids:
        turn_id = next((t for t, line in zip(turn_ids, lines, strict=False) if reply.what.lower() in line.lower()), "")
    return ForgetRequest(what=reply.what, turn_id=turn_id, detected_by="llm") if turn_id else None
