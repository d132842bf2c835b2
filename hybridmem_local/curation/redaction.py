"""Redaction planning: find the forget requests in a conversation, and what they name in a
namespace (``redaction_apply.py`` applies, undoes and confirms the plan; erasing a whole
namespace is ``HybridMemory.forget``).

    requests = detect_requests(session)                        # the rules (forget_rules.yaml)
    plan = plan_redaction(requests, turns, memories)           # what to remove; changes nothing

Detection. A user turn sentence asks to forget when it starts (or follows a cue such as
"please", "can you", "I want you to") with forget / erase / delete / remove + what
("please forget my social security number"), with "don't remember / keep / store" + what, or
says "I shouldn't have told you ..."; "I forgot my keys", "don't forget the milk" and "she
forgets names" ask nothing. Curation's LLM may mark requests too (``CurationReply.forget_requests``);
both go through :func:`plan_redaction`.

What a request names, most precise first:

1. *That / this / what I just said*: the sentences before the request in its own turn, or else
   the speaker's previous turn of that session, whole.
2. A kind of personal data with a recognisable form (``kinds`` in forget_rules.yaml: a card or
   account number, SSN, passport, email, phone, password, address): its value(s), found in the
   turns that name the thing and the turn after each (the answer to "what's your SSN?").
3. Otherwise a topic ("what I said about my brother's debt"): every sentence whose word stems
   include the topic's (all of them for one or two stems, two thirds for more).

A value found by 1 or 2 is then removed wherever it occurs in the namespace's turns and
memories, its digits matched whatever separators they were written with. In turns, each
removed span becomes :data:`REDACTION_MARKER`; the request's own sentence is kept (it names
the thing, not its value). A memory holding a value is rewritten with the marker in its place;
a memory about a removed topic or sentence is removed whole (its wording cannot be mapped back
to spans).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.errors import ConfigError
from hybridmem_local.files.readers import read_yaml_mapping
from hybridmem_local.schema import Episode, RelationalTuple, Session
from hybridmem_local.text.stems import tokenize

#: What a removed span becomes in a turn's text (and in a rewritten memory).
REDACTION_MARKER = "[removed at the user's request]"
RULES_PATH = Path(__file__).with_name("forget_rules.yaml")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
#: Stems that name the asking, never the topic.
_ASKING_STEMS = {"said", "told", "tell", "say", "thing", "stuff", "part", "bit", "fact", "just", "forget", "mention"}
_MEMORY_FIELDS = ("title", "summary", "details", "entity", "relation", "object", "context")


class ForgetRequest(BaseModel):
    """One request to forget: what the user named, the turn that asks, and who found it."""

    model_config = ConfigDict(extra="forbid")

    what: str = Field(min_length=1)
    turn_id: str
    #: "both": the rules found it and the LLM marked the same turn.
    detected_by: Literal["rules", "llm", "both"] = "rules"


class DataKind(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    words: list[str]
    value: str


class ForgetRules(BaseModel):
    """forget_rules.yaml, compiled."""

    model_config = ConfigDict(extra="forbid")

    version: str
    requests: list[str]
    dismissals: list[str]
    splits: str
    lead_words: str
    tail_words: str
    anaphora: str
    kinds: list[DataKind]

    def compiled(self) -> _Compiled:
        try:
            return _Compiled(
                requests=[re.compile(p.strip(), re.IGNORECASE) for p in self.requests],
                splits=re.compile(self.splits.strip(), re.IGNORECASE),
                lead=re.compile(self.lead_words.strip(), re.IGNORECASE),
                tail=re.compile(self.tail_words.strip(), re.IGNORECASE),
                anaphora=re.compile(self.anaphora.strip(), re.IGNORECASE),
                kinds=[
                    (kind, _words_pattern(kind.words), re.compile(kind.value.strip(), re.IGNORECASE))
                    for kind in self.kinds
                ],
            )
        except re.error as exc:
            raise ConfigError(f"{RULES_PATH}: a pattern does not compile: {exc}") from exc


@dataclass(frozen=True)
class _Compiled:
    requests: list[re.Pattern[str]]
    splits: re.Pattern[str]
    lead: re.Pattern[str]
    tail: re.Pattern[str]
    anaphora: re.Pattern[str]
    kinds: list[tuple[DataKind, re.Pattern[str], re.Pattern[str]]]


def _words_pattern(words: Iterable[str]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(re.escape(w) for w in words) + r")\b", re.IGNORECASE)


@cache
def load_rules() -> ForgetRules:
    return ForgetRules.model_validate(read_yaml_mapping(RULES_PATH, "forget rules", ConfigError))


@cache
def _rules() -> _Compiled:
    return load_rules().compiled()


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(text) if s.strip()]


# --------------------------------------------------------------------------- detection


def clean_what(raw: str) -> str:
    """What a request names, without the asking around it ("what I said about", "from your memory")."""
    rules = _rules()
    what = raw.strip().rstrip(".!?;,").strip()
    for _ in range(3):  # "about my X from your memory please": lead and tail words can nest
        what = rules.tail.sub("", rules.lead.sub("", what)).strip().rstrip(".!?;,").strip()
    return what


def detect_in_text(text: str) -> list[str]:
    """What each request in ``text`` names (cleaned); empty when the text asks nothing."""
    rules, found = _rules(), []
    dismissals = {d.lower() for d in load_rules().dismissals}
    for sentence in sentences(text):
        for clause in re.split(r"(?<=[;:])\s+|\s+-+\s+", sentence):
            for pattern in rules.requests:
                match = pattern.search(clause)
                if match is None:
                    continue
                named = re.split(r"[,;:]\s", match.group("what"))[0]
                found += [
                    what
                    for part in rules.splits.split(named)
                    if (what := clean_what(part)) and what.lower() not in dismissals
                ]
                break
    return list(dict.fromkeys(found))


def detect_requests(session: Session) -> list[ForgetRequest]:
    """The forget requests the rules find in a session's turns."""
    return [
        ForgetRequest(what=what, turn_id=turn.turn_id, detected_by="rules")
        for turn in session.turns
        for what in detect_in_text(turn.text)
    ]


def merge_requests(rules: Sequence[ForgetRequest], llm: Sequence[ForgetRequest]) -> list[ForgetRequest]:
    """The rules' requests (``both`` where the LLM marked their turn too), and the LLM's for
    turns the rules found nothing in."""
    marked = {r.turn_id for r in llm}
    seen = {r.turn_id for r in rules}
    both = [r.model_copy(update={"detected_by": "both"}) if r.turn_id in marked else r for r in rules]
    return [*both, *(r for r in llm if r.turn_id not in seen)]


# --------------------------------------------------------------------------- what a request names


@dataclass(frozen=True)
class TurnText:
    """A stored turn as the planner sees it (sessions in chronological order, turns in position order)."""

    turn_id: str
    session_id: str
    speaker: str
    text: str


@dataclass
class RedactionPlan:
    """What the requests name in a namespace; :func:`plan_redaction` changes nothing."""

    #: turn id → the turn's text with the named spans replaced by the marker.
    turns: dict[str, str] = field(default_factory=dict)
    #: The removed spans, per turn id (for review; never stored outside ``originals``).
    spans: dict[str, list[str]] = field(default_factory=dict)
    #: The values found (removed wherever they occur).
    values: list[str] = field(default_factory=list)
    #: Active memory id → its fields with the values replaced (stored as a new row).
    rewritten: dict[int, dict[str, str]] = field(default_factory=dict)
    #: Active memories about a removed topic or sentence: removed whole.
    deleted: list[int] = field(default_factory=list)
    #: Memories already retired (superseded, deleted) that hold the content: removed on confirm.
    retired: list[int] = field(default_factory=list)
    #: Each request's ``what``, values replaced by the marker (what the record may keep).
    requests: list[ForgetRequest] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.turns or self.rewritten or self.deleted or self.retired)


def value_pattern(value: str) -> re.Pattern[str]:
    """``value`` anywhere, case-insensitive; a value of 4+ digits whatever separates them
    ("123-45-6789" also finds "123 45 6789" and "123456789")."""
    digits = re.sub(r"\D", "", value)
    if len(digits) >= 4 and len(digits) >= len(re.sub(r"[\s().+-]", "", value)):
        return re.compile(r"(?<!\d)" + r"[\s().-]{0,2}".join(digits) + r"(?!\d)")
    return re.compile(r"(?<!\w)" + re.escape(value) + r"(?!\w)", re.IGNORECASE)


def _stems(text: str) -> set[str]:
    return set(tokenize([text])[0])


def _about(text_stems: set[str], topic: set[str]) -> bool:
    """True when ``text_stems`` hold the topic: all of one or two stems, two thirds of more."""
    if not topic:
        return False
    need = len(topic) if len(topic) <= 2 else math.ceil(len(topic) * 2 / 3)
    return len(topic & text_stems) >= need


def _values_in(text: str, pattern: re.Pattern[str]) -> list[str]:
    return [
        (m.group("value") if "value" in pattern.groupindex else m.group(0)).strip()
        for m in pattern.finditer(text)
        if (m.group("value") if "value" in pattern.groupindex else m.group(0)).strip()
    ]


def _is_request(sentence: str, what: str) -> bool:
    return bool(detect_in_text(sentence)) or (bool(what) and what.lower() in sentence.lower())


def plan_redaction(
    requests: Sequence[ForgetRequest],
    turns: Sequence[TurnText],
    memories: Sequence[Episode | RelationalTuple],
) -> RedactionPlan:
    """What ``requests`` name in a namespace's ``turns`` and ``memories`` (see the module docstring)."""
    rules = _rules()
    plan = RedactionPlan()
    position = {t.turn_id: i for i, t in enumerate(turns)}
    values: list[str] = []
    #: turn id → sentences to remove whole (anaphora, topics).
    sentence_spans: dict[str, list[str]] = {}
    topics: list[set[str]] = []
    every_sentence: list[tuple[str, str]] | None = None
    sentence_stems: list[set[str]] = []

    for request in requests:
        what = clean_what(request.what)
        at = position.get(request.turn_id)
        if rules.anaphora.match(what) or not what:
            if at is None:
                continue
            own = sentences(turns[at].text)
            first_request = next((i for i, s in enumerate(own) if _is_request(s, "")), len(own))
            if first_request > 0:
                targets = [(turns[at].turn_id, own[:first_request])]
            else:
                before = [
                    t for t in turns[:at] if t.session_id == turns[at].session_id and t.speaker == turns[at].speaker
                ]
                targets = [(before[-1].turn_id, sentences(before[-1].text))] if before else []
            for turn_id, removed in targets:
                sentence_spans.setdefault(turn_id, []).extend(removed)
                for _, _, value in rules.kinds:
                    values += [v for s in removed for v in _values_in(s, value)]
            continue
        kind = next(((k, words, value) for k, words, value in rules.kinds if words.search(what)), None)
        found: list[str] = []
        if kind is not None:
            _, words, value = kind
            for i, turn in enumerate(turns):
                if not words.search(turn.text):
                    continue
                found += _values_in(turn.text, value)
                if i + 1 < len(turns) and turns[i + 1].session_id == turn.session_id:
                    found += _values_in(turns[i + 1].text, value)
        if found:
            values += found
            continue
        topic = _stems(what) - _ASKING_STEMS
        if not topic:
            continue
        topics.append(topic)
        if every_sentence is None:  # stemmed once, in one batch, for all topic requests
            every_sentence = [(turn.turn_id, sentence) for turn in turns for sentence in sentences(turn.text)]
            sentence_stems = [set(stems) for stems in tokenize([sentence for _, sentence in every_sentence])]
        for (turn_id, sentence), stems in zip(every_sentence, sentence_stems, strict=True):
            if turn_id == request.turn_id and _is_request(sentence, what):
                continue
            if _about(stems, topic):
                sentence_spans.setdefault(turn_id, []).append(sentence)

    plan.values = list(dict.fromkeys(v for v in values if v and v != REDACTION_MARKER))
    patterns = [value_pattern(v) for v in plan.values]

    #: turn id → stems of the sentences removed from it whole (a memory citing the turn and
    #: restating them goes too: "Tom has a gambling debt" from "my brother Tom ... gambling debt").
    removed_stems: dict[str, set[str]] = {}
    for turn in turns:
        text = turn.text
        spans: list[str] = []
        for sentence in dict.fromkeys(sentence_spans.get(turn.turn_id, [])):
            if sentence in text:
                spans.append(sentence)
                text = text.replace(sentence, REDACTION_MARKER)
                removed_stems.setdefault(turn.turn_id, set()).update(_stems(sentence))
        for pattern in patterns:
            spans += [m.group(0) for m in pattern.finditer(text)]
            text = pattern.sub(REDACTION_MARKER, text)
        if text != turn.text:
            plan.turns[turn.turn_id] = _squeeze(text)
            plan.spans[turn.turn_id] = spans

    asking = {r.turn_id for r in requests}
    fields_of = {
        memory.id: {name: getattr(memory, name) for name in _MEMORY_FIELDS if getattr(memory, name, None)}
        for memory in memories
    }
    # Stems only matter when a topic or a removed sentence can make a memory go (one batch).
    stemmed = (
        [set(stems) for stems in tokenize([" ".join(f.values()) for f in fields_of.values()])]
        if (topics or removed_stems) and memories
        else [set() for _ in memories]
    )
    for memory, memory_stems in zip(memories, stemmed, strict=True):
        assert memory.id is not None  # stored memories have ids
        fields = fields_of[memory.id]
        rewritten = dict(fields)
        for pattern in patterns:
            rewritten = {name: pattern.sub(REDACTION_MARKER, text) for name, text in rewritten.items()}
        # A memory of the request alone ("the user asked to forget their diagnosis") names the topic, not its content.
        restates_request = bool(memory.source_turn_ids) and set(memory.source_turn_ids) <= asking
        about_removed = (not restates_request and any(_about(memory_stems, topic) for topic in topics)) or any(
            len(memory_stems & removed_stems[t]) >= 2 for t in memory.source_turn_ids if t in removed_stems
        )
        if memory.status != "active":
            if rewritten != fields or about_removed:
                plan.retired.append(memory.id)
        elif about_removed:
            plan.deleted.append(memory.id)
        elif rewritten != fields:
            plan.rewritten[memory.id] = {name: _squeeze(text) for name, text in rewritten.items()}

    plan.requests = [r.model_copy(update={"what": _masked(r.what, patterns)}) for r in requests if r.what.strip()]
    return plan


def _masked(text: str, patterns: Sequence[re.Pattern[str]]) -> str:
    for pattern in patterns:
        text = pattern.sub(REDACTION_MARKER, text)
    return text


def _squeeze(text: str) -> str:
    """Neighbouring markers become one ("[removed] [removed]" says no more than "[removed]")."""
    marker = re.escape(REDACTION_MARKER)
    return re.sub(rf"{marker}(?:[\s,;]*{marker})+", REDACTION_MARKER, text)
