"""Whose is a memory? The check that its subject is the one its cited turns speak of.

The 1.5B curator's commonest error (docs/benchmarks.md §15: a third of 100 memories read by
hand) gives one person's news to the other: it cites the partner's reply ("Congrats on the
internship!", "How did the interview go?") and makes the replier the subject, or cites a turn
where someone else speaks in the first person. So a memory about a person must cite a turn that
speaks of them:

* a turn they speak in the first person ("I", "my", "we" ...), or share an image in;
* a turn that names them;
* in a conversation of two, a turn of the other one addressing them ("you", "your").

A memory's subject is the people its tuple's entity or its episode's title names (the speakers
of the conversation); a memory naming nobody is not checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hybridmem_local.schema import EpisodeDraft, TupleDraft, Turn

FIRST_PERSON = frozenset(
    [
        "i",
        "i'm",
        "im",
        "i've",
        "ive",
        "i'd",
        "i'll",
        "me",
        "my",
        "mine",
        "myself",
        "we",
        "we're",
        "we've",
        "our",
        "ours",
        "us",
    ]
)
SECOND_PERSON = frozenset(["you", "you're", "youre", "you've", "you'd", "you'll", "your", "yours", "yourself"])
_WORD = re.compile(r"[a-z']+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower().replace("\u2019", "'")))


def named(text: str, people: Sequence[str]) -> set[str]:
    """The people of ``people`` that ``text`` names (whole words, any case)."""
    return {p for p in people if re.search(rf"\b{re.escape(p)}\b", text, re.IGNORECASE)}


def subjects(memory: EpisodeDraft | TupleDraft, people: Sequence[str]) -> set[str]:
    """Who a memory is about: the people its tuple's entity, or its episode's title, names."""
    return named(memory.entity if isinstance(memory, TupleDraft) else memory.title, people)


def speaks_of(turn: Turn, person: str, people: Sequence[str]) -> bool:
    """Whether ``turn`` says something of ``person`` (see the module docstring)."""
    if named(turn.text, [person]):
        return True
    words = _words(turn.text)
    if turn.speaker == person:
        return bool(words & FIRST_PERSON) or bool(turn.image_caption)
    return len(people) == 2 and bool(words & SECOND_PERSON)


def unsupported_subjects(memory: EpisodeDraft | TupleDraft, cited: Sequence[Turn], people: Sequence[str]) -> set[str]:
    """The memory's subjects of whom none of its ``cited`` turns speaks: empty when it is sound."""
    return {p for p in subjects(memory, people) if not any(speaks_of(t, p, people) for t in cited)}
