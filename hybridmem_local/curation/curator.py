"""Session curation (paper §3.1): a session's turns in, episodes and relational tuples out.

    curator = Curator(llm, config.llm, config.curation, embed=embedder.embed)
    outcomes = curator.curate(sessions)        # one batched llm.generate for all of them
    for outcome in outcomes:
        outcome.result                         # CurationResult, or None with outcome.error set

Flow of one session:

1. Each turn is rendered as ``[turn_id] speaker: text`` (``Turn.render``), relative dates
   annotated with their absolute date first (``dates.annotate_relative_dates``).
2. The turns are split into *windows* of whole turns so that the prompt, the turns and
   ``max_new_tokens`` fit ``LLMConfig.context_tokens`` (measured with ``llm.count_tokens``).
   A short session is one window; a single turn longer than a whole window is cut to fit
   (the stored turn is untouched).
3. All windows of all sessions go to the LLM in **one** ``generate`` call, constrained to
   :class:`CurationReply` with list caps and a reply budget sized to the window
   (:meth:`Curator.reply_size`: about one episode per 3 turns and a tuple per turn, within
   ``max_episodes_per_window`` / ``max_tuples_per_window``). A reply cut off at its budget, or
   ended by the backend's repetition guard, keeps its complete memories (``salvage_partial``).
   Windows whose reply still failed (after the
   backend's own retries) are re-sent split in half, all together, for
   ``CurationConfig.retry_rounds`` more rounds: a shorter window fits the context and its
   reply fits ``max_new_tokens``.
4. Each reply is checked (``replies.py``): ``source_turn_ids`` must name turns of the window
   the model was shown (others are dropped and reported in ``dropped_turn_ids``); a memory left with no
   valid id is kept, its content is not at fault, and *aligned* to the window's turns by
   lexical + embedding similarity (``text/alignment.py``; provenance ``aligned``, where kept ids
   give ``cited``), so every curated memory leads back to its evidence. Without ``embed``
   such a memory keeps an empty list. A timestamp that is not a real date falls back to the
   session date. A memory about one speaker that its session's turns state as the other
   speaker's own news is left out (``CurationConfig.speaker_check``, ``text/attribution.py``).
   Window results are concatenated in turn order.

A session with any window still failing gets ``result=None`` and ``error`` set: storing part
of a session would silently lose the rest, while the caller keeps the raw session (marked
``curation_failed``) and can curate it again; with the call cache on, the windows that did
succeed cost nothing the second time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.config import CurationConfig, LLMConfig
from hybridmem_local.curation.dates import annotate_relative_dates
from hybridmem_local.curation.redaction import ForgetRequest
from hybridmem_local.curation.replies import CheckedReply, CurationReply, check_curation_reply, reply_schema
from hybridmem_local.errors import ConfigError, LLMError
from hybridmem_local.llm.base import LLMRequest, LLMResult, StructuredLLM
from hybridmem_local.prompts import PromptTemplate, load_prompt
from hybridmem_local.schema import (
    CurationResult,
    EpisodeDraft,
    Session,
    TupleDraft,
    Turn,
)
from hybridmem_local.text.alignment import Aligner, AlignmentSettings, Embed, content_text
from hybridmem_local.text.attribution import SessionAttribution
from hybridmem_local.usage import LLMUsage

log = logging.getLogger(__name__)

#: Chat-template tokens (role markers, BOS) that ``count_tokens`` of the message texts misses.
TEMPLATE_ALLOWANCE_TOKENS = 48
#: A reply's JSON around its items: the braces, both list names, whitespace.
REPLY_FRAME_TOKENS = 32
#: Below this many tokens for turns, windows would hold too little conversation to be useful.
MIN_TURN_BUDGET_TOKENS = 64

# --------------------------------------------------------------------------- outcome


class CurationOutcome(BaseModel):
    """One session's curation: the memories (or the error) and what they cost."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    namespace: str
    result: CurationResult | None
    error: str | None = None
    prompt_version: str
    #: Requests sent for this session (windows, plus re-sent halves; the backend's own
    #: validation retries are inside these and show only in the token counts), tokens, and
    #: model time (the sum of their latencies; cache hits count 0).
    usage: LLMUsage = Field(default_factory=LLMUsage)
    #: Windows of the first attempt.
    windows: int = 0
    #: Cited ids that name no turn the model was shown, dropped from the memories.
    dropped_turn_ids: list[str] = Field(default_factory=list)
    #: Memories left without a valid cited id and aligned to their window's turns instead.
    aligned_memories: int = 0
    #: Timestamps that were not a real date and were replaced by the session date.
    timestamps_defaulted: int = 0
    #: Windows whose first reply failed (they were re-sent split in half, if rounds remained).
    windows_failed_first: int = 0
    #: Replies cut off (budget or repetition guard) of which the complete memories were kept.
    windows_salvaged: int = 0
    #: Memories left out, with why: no content (only turn ids or schema names, a decoding loop)
    #: or not from the window (:func:`ungrounded`).
    dropped_memories: list[str] = Field(default_factory=list)
    #: Requests to forget that the LLM marked, each placed on a turn of the session.
    forget_requests: list[ForgetRequest] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


# --------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class Window:
    """Consecutive whole turns of one session, sent to the LLM as one request."""

    session_index: int
    session: Session
    #: Position of the first turn in the session (results are put back in this order).
    start: int
    turns: tuple[Turn, ...]
    #: The rendered (date-annotated, possibly cut) line of each turn.
    lines: tuple[str, ...]

    @property
    def turn_ids(self) -> list[str]:
        return [t.turn_id for t in self.turns]

    def describe(self) -> str:
        return f"turns {self.turns[0].turn_id}..{self.turns[-1].turn_id}"

    def halves(self) -> list[Window]:
        """Two windows of half the turns each; a single-turn window is returned as is."""
        if len(self.turns) < 2:
            return [self]
        mid = len(self.turns) // 2
        return [
            Window(self.session_index, self.session, self.start, self.turns[:mid], self.lines[:mid]),
            Window(self.session_index, self.session, self.start + mid, self.turns[mid:], self.lines[mid:]),
        ]


@dataclass
class _Tally:
    """What one session has accumulated over its windows and rounds."""

    windows: int = 0
    failed_first: int = 0
    salvaged: int = 0
    usage: LLMUsage = field(default_factory=LLMUsage)
    parts: list[tuple[int, CheckedReply]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def format_session_date(moment: datetime) -> str:
    """``2023-05-08 (Monday) 13:56 UTC``: the weekday helps resolve "last Friday"."""
    return f"{moment:%Y-%m-%d (%A) %H:%M} {moment.tzname() or ''}".rstrip()


# --------------------------------------------------------------------------- curator


_DraftT = TypeVar("_DraftT", EpisodeDraft, TupleDraft)


def _aligned(memory: _DraftT, turns_of: dict[int, list[str]]) -> _DraftT:
    """``memory`` with the turns it was aligned to (``turns_of``, by object id), when it was."""
    if id(memory) not in turns_of:
        return memory
    return memory.model_copy(update={"source_turn_ids": turns_of[id(memory)], "provenance": "aligned"})


class Curator:
    """Curates sessions with any :class:`StructuredLLM`; see the module docstring."""

    def __init__(self, llm: StructuredLLM, llm_config: LLMConfig, config: CurationConfig, embed: Embed | None = None):
        self.llm = llm
        self.llm_config = llm_config
        self.config = config
        settings = AlignmentSettings(
            max_turns=config.align_max_turns,
            min_score=config.align_min_score,
            lexical_weight=config.align_lexical_weight,
        )
        self.aligner = Aligner(embed, settings) if embed is not None else None
        self.prompt: PromptTemplate = load_prompt(config.prompt)
        self.turn_budget = self._turn_budget()

    def _turn_budget(self) -> int:
        """Tokens left for turn lines once the prompt, the reply and the chat template fit."""
        skeleton = self.prompt.messages(
            session_date=format_session_date(datetime(2023, 12, 27, 23, 59, tzinfo=timezone.utc)),
            window_note=self._window_note(Turn(turn_id="x" * 12, speaker="x", text="x"), 1000),
            turns="",
            example_turn_id="x" * 12,
        )
        overhead = sum(self.llm.count_tokens(m.content) for m in skeleton) + TEMPLATE_ALLOWANCE_TOKENS
        budget = self.llm_config.context_tokens - self.llm_config.max_new_tokens - overhead
        if budget < MIN_TURN_BUDGET_TOKENS:
            raise ConfigError(
                f"llm.context_tokens={self.llm_config.context_tokens} leaves {budget} tokens for turns after "
                f"the curation prompt ({overhead}) and llm.max_new_tokens={self.llm_config.max_new_tokens}; "
                f"raise context_tokens or lower max_new_tokens"
            )
        return budget

    @staticmethod
    def _window_note(first: Turn, n_turns: int) -> str:
        return f"(Part of a longer session of {n_turns} turns, starting at turn {first.turn_id}.)"

    # ------------------------------------------------------------------ windows

    def render_lines(self, session: Session) -> list[str]:
        """Each turn's prompt line: relative dates annotated, cut to the window budget."""
        lines = []
        for turn in session.turns:
            if self.config.annotate_relative_dates:
                turn = turn.model_copy(update={"text": annotate_relative_dates(turn.text, session.started_at)})
            lines.append(self._fit(turn.render(), session.session_id))
        return lines

    def _fit(self, line: str, session_id: str) -> str:
        tokens = self.llm.count_tokens(line + "\n")  # as the window split counts it
        if tokens <= self.turn_budget:
            return line
        log.warning(
            "session %s: a turn of %d tokens is cut to the %d-token window", session_id, tokens, self.turn_budget
        )
        while tokens > self.turn_budget:
            line = line[: int(len(line) * self.turn_budget / tokens * 0.9)]
            tokens = self.llm.count_tokens(line + " [cut]\n")
        return line + " [cut]"

    def windows(self, session: Session, session_index: int = 0) -> list[Window]:
        """Greedy split into consecutive whole turns, each window within the token budget."""
        lines = self.render_lines(session)
        windows: list[Window] = []
        start, used = 0, 0
        for i, line in enumerate(lines):
            tokens = self.llm.count_tokens(line + "\n")
            if i > start and used + tokens > self.turn_budget:
                windows.append(self._window(session, session_index, start, i, lines))
                start, used = i, 0
            used += tokens
        windows.append(self._window(session, session_index, start, len(lines), lines))
        return windows

    @staticmethod
    def _window(session: Session, session_index: int, start: int, end: int, lines: list[str]) -> Window:
        return Window(session_index, session, start, tuple(session.turns[start:end]), tuple(lines[start:end]))

    def reply_size(self, window: Window) -> tuple[int, int, int]:
        """``(episodes, tuples, tokens)`` the window's reply may hold: items in proportion to its
        turns (within the configured caps), tokens for those items (within llm.max_new_tokens,
        which the windows were sized for)."""
        config, turns = self.config, len(window.turns)
        episodes = min(config.max_episodes_per_window, math.ceil(turns / config.turns_per_episode))
        tuples = min(config.max_tuples_per_window, math.ceil(turns * config.tuples_per_turn))
        tokens = REPLY_FRAME_TOKENS + episodes * config.episode_reply_tokens + tuples * config.tuple_reply_tokens
        return episodes, tuples, min(tokens, self.llm_config.max_new_tokens)

    def request(self, window: Window) -> LLMRequest:
        session = window.session
        whole = len(window.turns) == len(session.turns)
        messages = self.prompt.messages(
            session_date=format_session_date(session.started_at),
            window_note="" if whole else self._window_note(window.turns[0], len(session.turns)),
            turns="\n".join(window.lines),
            # The window's own id: an example id the model was not shown gets copied instead.
            example_turn_id=window.turns[min(1, len(window.turns) - 1)].turn_id,
        )
        episodes, tuples, tokens = self.reply_size(window)
        return LLMRequest(
            messages=messages,
            output_schema=reply_schema(episodes, tuples),
            max_new_tokens=tokens,
            enable_thinking=False,
            prompt_version=self.prompt.version,
            tag=session.namespace,
            salvage_partial=True,
        )

    # ------------------------------------------------------------------ curate

    def curate(self, sessions: Sequence[Session]) -> list[CurationOutcome]:
        """Curate every session: one batched LLM call, then at most ``retry_rounds`` more."""
        tallies = [_Tally() for _ in sessions]
        pending: list[Window] = []
        for index, session in enumerate(sessions):
            session_windows = self.windows(session, index)
            tallies[index].windows = len(session_windows)
            pending.extend(session_windows)

        for round_number in range(self.config.retry_rounds + 1):
            if not pending:
                break
            failed: list[tuple[Window, str]] = []
            for window, result in zip(pending, self._generate(pending), strict=True):
                tally = tallies[window.session_index]
                tally.usage.count([result])
                tally.salvaged += result.salvaged
                if round_number == 0 and not result.ok:
                    tally.failed_first += 1
                if result.ok and isinstance(result.parsed, CurationReply):
                    checked = check_curation_reply(
                        result.parsed,
                        window.turn_ids,
                        window.session.started_at.date(),
                        window.lines,
                        self.config.max_ungrounded_share,
                    )
                    tally.parts.append((window.start, self._attribute(self._align(checked, window), window)))
                else:
                    failed.append((window, result.error or "reply is not a CurationReply"))
            last_round = round_number == self.config.retry_rounds
            if failed and not last_round:
                log.info("curation: %d window(s) failed, re-sending them split in half", len(failed))
            if last_round:
                for window, error in failed:
                    tallies[window.session_index].errors.append(f"{window.describe()}: {error}")
            pending = [half for window, _ in failed for half in window.halves()]

        return [self._outcome(session, tally) for session, tally in zip(sessions, tallies, strict=True)]

    def _align(self, checked: CheckedReply, window: Window) -> CheckedReply:
        """Give every memory left without a valid cited id the turns of ``window`` it matches best."""
        if self.aligner is None:
            return checked
        memories: list[EpisodeDraft | TupleDraft] = [*checked.episodes, *checked.tuples]
        bare = [m for m in memories if not m.source_turn_ids]
        found = self.aligner.align_all([content_text(m) for m in bare], window.turns)
        turns_of = {id(m): ids for m, ids in zip(bare, found, strict=True)}
        checked.episodes = [_aligned(m, turns_of) for m in checked.episodes]
        checked.tuples = [_aligned(m, turns_of) for m in checked.tuples]
        checked.aligned = len(turns_of)
        return checked

    def _attribute(self, checked: CheckedReply, window: Window) -> CheckedReply:
        """Leave out the memories its session states as another speaker's news (``speaker_check``)."""
        if not self.config.speaker_check:
            return checked
        turns = window.session.turns
        session = SessionAttribution(turns, list(dict.fromkeys(t.speaker for t in turns)))

        def kept(memories: list[_DraftT], kind: str) -> list[_DraftT]:
            out = []
            for memory in memories:
                if wrong := session.misattributed(memory):
                    name = memory.title if isinstance(memory, EpisodeDraft) else memory.entity
                    reason = f"the other speaker's news, not {min(wrong)}'s"
                    checked.dropped_memories.append(f"{kind} {name[:40]!r}: {reason}")
                else:
                    out.append(memory)
            return out

        checked.episodes = kept(checked.episodes, "episode")
        checked.tuples = kept(checked.tuples, "tuple")
        return checked

    def _generate(self, windows: list[Window]) -> list[LLMResult]:
        """One batched call; a backend that cannot be reached fails these windows, not the run."""
        try:
            return self.llm.generate([self.request(w) for w in windows])
        except LLMError as exc:
            log.error("curation: the LLM backend failed for %d window(s): %s", len(windows), exc)
            return [LLMResult(error=f"LLM backend failed: {exc}") for _ in windows]

    def _outcome(self, session: Session, tally: _Tally) -> CurationOutcome:
        parts = [checked for _, checked in sorted(tally.parts, key=lambda part: part[0])]
        dropped = list(dict.fromkeys(t for p in parts for t in p.dropped_turn_ids))
        if dropped:
            log.info(
                "session %s: dropped cited turn ids that the model was not shown: %s", session.session_id, dropped[:10]
            )
        empty = [problem for p in parts for problem in p.dropped_memories]
        if empty:
            log.info("session %s: memories left out (%d): %s", session.session_id, len(empty), empty)
        result = None
        if not tally.errors:
            result = CurationResult(
                episodes=[e for p in parts for e in p.episodes], tuples=[t for p in parts for t in p.tuples]
            )
        return CurationOutcome(
            session_id=session.session_id,
            namespace=session.namespace,
            result=result,
            error="; ".join(tally.errors) or None,
            prompt_version=self.prompt.version,
            usage=tally.usage,
            windows=tally.windows,
            dropped_turn_ids=dropped,
            aligned_memories=sum(p.aligned for p in parts),
            timestamps_defaulted=sum(p.timestamps_defaulted for p in parts),
            windows_failed_first=tally.failed_first,
            windows_salvaged=tally.salvaged,
            dropped_memories=empty,
            forget_requests=[r for p in parts for r in p.forget_requests],
        )
