"""Whose is a memory? Two checks that its subject is the person its turns speak of.

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

That check (:func:`unsupported_subjects`) catches little: in a chat of two, both names and "you"
are in almost every turn. :func:`misattributed` looks instead at the turn that *states* the
memory's content, wherever it is in the session, and at who speaks it:

* the stating turns (:func:`stating_turns`): the session's turns (text and image caption) that
  share the most word stems with the memory's content (:func:`~.alignment.content_text`, stemmed
  as alignment and BM25 stem it, the people's names left out); all of them on a tie, none when
  the best shares fewer than :data:`MIN_SHARED_STEMS`;
* a memory about one person (one of ``people`` named by its entity or title) is flagged when
  every stating turn is another person speaking of themself: in the first person (or sharing an
  image), without naming the subject except to address them ("Thanks, Jon!", "Hey Jon!").

"I got the internship!", said by Gina, then states "Jon got an internship" as Gina's news: it is
flagged. Not flagged: a stating turn the subject speaks; one naming them ("Jon told me he got
the job"); one in which the other person speaks only to them ("Congrats on your internship!");
a memory about several people, or about nobody. A false flag drops a right memory, so a turn
that could be about the subject keeps the memory. On the 100 labelled memories of
docs/benchmarks.md §15 (the same memories the rule was chosen on, so the figures flatter it),
``scripts/measure_speaker_check.py`` measures both checks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hybridmem_local.schema import EpisodeDraft, TupleDraft, Turn
from hybridmem_local.text.alignment import content_text
from hybridmem_local.text.stems import tokenize

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
#: A stating turn must share at least this many word stems with the memory: one is no evidence.
MIN_SHARED_STEMS = 2
#: Words that open an address to someone by name ("Hey Jon!", "Thanks Gina!").
_GREETING = r"(?:hey|hi|hello|thanks|thank you|wow|congrats|congratulations|oh|yo|sorry|dear|yeah|yes|sure|nice)"


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
    if turn.speaker == person:
        return speaks_of_self(turn)
    return len(people) == 2 and bool(_words(turn.text) & SECOND_PERSON)


def unsupported_subjects(memory: EpisodeDraft | TupleDraft, cited: Sequence[Turn], people: Sequence[str]) -> set[str]:
    """The memory's subjects of whom none of its ``cited`` turns speaks: empty when it is sound."""
    return {p for p in subjects(memory, people) if not any(speaks_of(t, p, people) for t in cited)}


def mentions(text: str, person: str) -> bool:
    """Whether ``text`` names ``person`` other than to address them: "Jon told me", not
    "Thanks, Jon!" or "Hey Jon, ..." (a name followed by punctuation or the end, after the start of
    a sentence, a comma or a greeting)."""
    for match in re.finditer(rf"\b{re.escape(person)}\b", text, re.IGNORECASE):
        before, after = text[: match.start()], text[match.end() :]
        addressed = re.match(r"\s*(?:[,.!?;:]|$)", after) and re.search(
            rf"(?:^|[,.!?]\s*|\b{_GREETING}[,!]?\s+)$", before, re.IGNORECASE
        )
        if not addressed:
            return True
    return False


def speaks_of_self(turn: Turn) -> bool:
    """Whether ``turn``'s speaker speaks of themself: in the first person, or sharing an image."""
    return bool(_words(turn.text) & FIRST_PERSON) or bool(turn.image_caption)


class SessionAttribution:
    """One session's turns and people, stemmed once for every memory checked against them."""

    def __init__(self, turns: Sequence[Turn], people: Sequence[str]):
        self.turns = list(turns)
        self.people = list(people)
        texts = [*(f"{t.text} {t.image_caption or ''}" for t in self.turns), *self.people]
        stems = [set(s) for s in tokenize(texts)] if texts else []
        self._turn_stems = stems[: len(self.turns)]
        self._names: set[str] = set().union(*stems[len(self.turns) :])

    def stating_turns(self, memory: EpisodeDraft | TupleDraft) -> list[Turn]:
        """The turns that share the most word stems (text and image caption) with the memory's
        content, the people's names left out; all of them on a tie, none when the best shares
        fewer than :data:`MIN_SHARED_STEMS`."""
        if not self.turns:
            return []
        content = set(tokenize([content_text(memory)])[0]) - self._names
        shared = [len(content & stems) for stems in self._turn_stems]
        best = max(shared)
        return [t for t, n in zip(self.turns, shared, strict=True) if n == best] if best >= MIN_SHARED_STEMS else []

    def misattributed(self, memory: EpisodeDraft | TupleDraft) -> set[str]:
        """The memory's subject when the turns that state it are another person's own news (see
        the module docstring): empty when it is sound, when no turn states it, or when it is about
        several people or nobody."""
        about = subjects(memory, self.people)
        if len(about) != 1:
            return set()
        (person,) = about
        stating = self.stating_turns(memory)
        if stating and all(t.speaker != person and speaks_of_self(t) and not mentions(t.text, person) for t in stating):
            return {person}
        return set()


def stating_turns(memory: EpisodeDraft | TupleDraft, turns: Sequence[Turn], people: Sequence[str]) -> list[Turn]:
    """:meth:`SessionAttribution.stating_turns` for one memory."""
    return SessionAttribution(turns, people).stating_turns(memory)


def misattributed(memory: EpisodeDraft | TupleDraft, session_turns: Sequence[Turn], people: Sequence[str]) -> set[str]:
    """:meth:`SessionAttribution.misattributed` for one memory (several memories of one session:
    build the :class:`SessionAttribution` once)."""
    return SessionAttribution(session_turns, people).misattributed(memory)
