"""Context assembly: a search result rendered as the memory block of an answer prompt.

Two selections:

* fixed (default): everything the search returned — the paper's top-k episodes and top-2k
  tuples (and top-k windows when windows are a source);
* budget: as much as fits a number of tokens of the answer model's tokenizer, taken in fused
  rank order across stores (reciprocal rank fusion of the stores' own rankings, so the i-th
  hit of every store comes before the (i+1)-th of any), skipping what no longer fits.

A search result carrying its memories' source turns (``SearchResult.source_turns``, attached
when ``answering.evidence_turns`` is on) shows each chosen memory's turns among the raw turns,
paid from the same budget: a memory comes with its turns when both fit, alone when only it
does.

Raw-turn windows and memories' turns that overlap or touch are merged into one block, so a turn
is shown — and paid for — once; each session's turns appear under one date header instead of a
date on every line. Everything is rendered in chronological order, whatever order it was
selected in. The result reports the tokens used and the exact provenance covered (turn ids).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.retrieval.fusion import DEFAULT_RRF_K, reciprocal_rank_fusion
from hybridmem_local.schema import EvidenceWindow, Hit, SearchResult, Turn, turn_line

CountTokens = Callable[[str], int]

_SECTIONS = (("E", "Episodic memories"), ("T", "Relational memories"), ("W", "Conversation excerpts"))
NO_MEMORIES = "(no memories)"


class RenderedContext(BaseModel):
    """The memory block an answer prompt shows, the short ids it uses and what it covers."""

    model_config = ConfigDict(extra="forbid")

    text: str
    #: Short id shown to the LLM ("E1", "T4") → memory id.
    short_ids: dict[str, int]
    #: Short id → the memory as shown (its line without the id): text-mode answers are aligned to it.
    memory_texts: dict[str, str] = Field(default_factory=dict)
    #: Short id of a block of raw turns ("W1") → the turn ids it shows. Window ids are not
    #: memory ids, so they never share ``short_ids``.
    window_turns: dict[str, list[str]] = Field(default_factory=dict)
    #: Provenance covered: every source turn of the memories shown, then every turn shown.
    turn_ids: list[str] = Field(default_factory=list)
    #: Tokens of ``text`` in the answer model's tokenizer (None when no counter was given).
    tokens: int | None = None


class _Item(NamedTuple):
    prefix: Literal["E", "T", "W"]
    hit: Hit | EvidenceWindow


def format_context(
    result: SearchResult,
    budget: int | None = None,
    count_tokens: CountTokens | None = None,
    source_weights: Mapping[str, float] | None = None,
) -> RenderedContext:
    """Render a search result: everything it holds, or as much as fits ``budget`` tokens.

    Episodes (with dates), then tuples, then raw-turn windows under one date header per
    session; each block in chronological order. With ``budget``, items are taken in fused
    rank order across stores until no further one fits; ``count_tokens`` (the answer model's
    ``StructuredLLM.count_tokens``) is then required. ``source_weights`` weighs each store's
    ranking ("episodes", "tuples", "windows") in the fused order; missing stores weigh 1.
    """
    candidates = _fused_order(result, source_weights)
    evidence = _evidence_turns(result)
    if budget is None:
        chosen = [pick for item in candidates for pick in [item, *_window_items(evidence.get(_item_key(item), []))]]
    else:
        if count_tokens is None:
            raise InvalidInputError("a context budget needs count_tokens (the answer model's tokenizer)")
        if budget < 1:
            raise InvalidInputError(f"context budget must be at least 1 token, got {budget}")
        chosen = _fill(candidates, evidence, budget, _CachedCounter(count_tokens))
    rendered = _render(chosen)
    if count_tokens is not None:
        rendered.tokens = count_tokens(rendered.text)
        # Counting line by line can miss a token or two at line joins: drop the last pick until it fits.
        while budget is not None and rendered.tokens > budget and chosen:
            chosen = chosen[:-1]
            rendered = _render(chosen)
            rendered.tokens = count_tokens(rendered.text)
    return rendered


def _fused_order(result: SearchResult, source_weights: Mapping[str, float] | None = None) -> list[_Item]:
    """Every hit, in fused rank order across stores."""
    items = {
        "episodes": [_Item("E", h) for h in result.episodes],
        "tuples": [_Item("T", h) for h in result.tuples],
        "windows": [_Item("W", h.window) for h in result.windows],
    }
    keyed = {name: [(item.prefix, _item_id(item)) for item in group] for name, group in items.items()}
    by_key = {key: item for name in items for key, item in zip(keyed[name], items[name], strict=True)}
    return [by_key[key] for key, _ in reciprocal_rank_fusion(keyed, k=DEFAULT_RRF_K, weights=source_weights)]


def _item_id(item: _Item) -> int:
    return item.hit.id if isinstance(item.hit, EvidenceWindow) else item.hit.memory.stored_id


def _item_key(item: _Item) -> tuple[str, int]:
    return item.prefix, _item_id(item)


def _window_items(windows: list[EvidenceWindow]) -> list[_Item]:
    return [_Item("W", window) for window in windows]


def _evidence_turns(result: SearchResult) -> dict[tuple[str, int], list[EvidenceWindow]]:
    """Each memory's attached source turns (one-turn windows, in its citation order) by item key."""
    if not result.source_turns:
        return {}
    by_turn = {window.turns[0].turn_id: window for window in result.source_turns}
    return {
        (prefix, hit.memory.stored_id): [by_turn[t] for t in hit.memory.source_turn_ids if t in by_turn]
        for prefix, hits in (("E", result.episodes), ("T", result.tuples))
        for hit in hits
    }


class _CachedCounter:
    def __init__(self, count_tokens: CountTokens):
        self._count = count_tokens
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if text not in self._cache:
            self._cache[text] = self._count(text)
        return self._cache[text]


def _fill(
    candidates: list[_Item], evidence: dict[tuple[str, int], list[EvidenceWindow]], budget: int, count: _CachedCounter
) -> list[_Item]:
    """Greedy first-fit in rank order. Raw turns pay only for the turns not shown yet; a memory
    brings its evidence turns when memory and turns fit, and comes alone when only it does."""
    chosen: list[_Item] = []
    used = 0
    sections: list[str] = []
    shown: dict[str, set[int]] = defaultdict(set)  # session id → positions already shown
    for item in candidates:
        if isinstance(item.hit, EvidenceWindow):
            options = [[item]] if _new_turns([item.hit], shown) else []
        else:
            turns = _window_items([w for w in evidence.get(_item_key(item), []) if _new_turns([w], shown)])
            options = [[item, *turns], [item]] if turns else [[item]]
        for picks in options:
            cost = _cost(picks, sections, shown, count)
            if used + cost <= budget:
                used += cost
                chosen += picks
                for pick in picks:
                    if pick.prefix not in sections:
                        sections.append(pick.prefix)
                    if isinstance(pick.hit, EvidenceWindow):
                        shown[pick.hit.session_id].update(_positions(pick.hit))
                break
    return chosen


def _positions(window: EvidenceWindow) -> range:
    return range(window.start, window.start + len(window.turns))


def _new_turns(windows: list[EvidenceWindow], shown: dict[str, set[int]]) -> dict[str, dict[int, Turn]]:
    """The turns of these windows not shown yet: session id → position → turn."""
    new: dict[str, dict[int, Turn]] = defaultdict(dict)
    for window in windows:
        for position, turn in zip(_positions(window), window.turns, strict=True):
            if position not in shown[window.session_id]:
                new[window.session_id][position] = turn
    return new


def _cost(picks: list[_Item], sections: list[str], shown: dict[str, set[int]], count: _CachedCounter) -> int:
    """Tokens ``picks`` add to a context holding ``sections`` and the ``shown`` turns."""
    cost = 0
    for prefix in dict.fromkeys(pick.prefix for pick in picks):
        if prefix not in sections:
            cost += count(_section_header(prefix, first=not sections))
    raw = [pick.hit for pick in picks if isinstance(pick.hit, EvidenceWindow)]
    firsts = {window.session_id: window for window in raw}
    for session_id, turns in _new_turns(raw, shown).items():
        before = shown[session_id]
        if not before:
            cost += count(_session_header(firsts[session_id]) + "\n")
        # Each run of consecutive turns gets a "[W1] " id: new turns touching a shown run join it,
        # and a turn bridging two runs saves one id (a negative change).
        cost += count("[W1] ") * (_runs(before | set(turns)) - _runs(before))
        cost += sum(count(turn_line(t) + "\n") for t in turns.values())
    for pick in picks:
        if isinstance(pick.hit, Hit):
            cost += count(f"[{pick.prefix}1] {pick.hit.memory.render()}\n")
    return cost


def _runs(positions: set[int]) -> int:
    """Runs of consecutive positions."""
    return sum(1 for p in positions if p - 1 not in positions)


def _section_header(prefix: str, first: bool) -> str:
    title = dict(_SECTIONS)[prefix]
    return f"## {title}\n" if first else f"\n## {title}\n"


def _session_header(window: EvidenceWindow) -> str:
    return f"### {window.session_date:%Y-%m-%d (%A)}"


def _render(chosen: list[_Item]) -> RenderedContext:
    short_ids: dict[str, int] = {}
    memory_texts: dict[str, str] = {}
    window_turns: dict[str, list[str]] = {}
    provenance: dict[str, None] = {}
    lines: list[str] = []
    for prefix, title in _SECTIONS:
        windows = [item.hit for item in chosen if item.prefix == prefix and isinstance(item.hit, EvidenceWindow)]
        hits = [item.hit for item in chosen if item.prefix == prefix and isinstance(item.hit, Hit)]
        if not windows and not hits:
            continue
        lines.append(f"## {title}")
        if windows:
            for short, turns, block_lines in _window_blocks(windows):
                window_turns[short] = [t.turn_id for t in turns]
                provenance.update(dict.fromkeys(window_turns[short]))
                lines.extend(block_lines)
        else:
            for i, hit in enumerate(sorted(hits, key=lambda h: (h.memory.timestamp, h.memory.stored_id)), start=1):
                short = f"{prefix}{i}"
                short_ids[short] = hit.memory.stored_id
                memory_texts[short] = hit.memory.render()
                provenance.update(dict.fromkeys(hit.memory.source_turn_ids))
                lines.append(f"[{short}] {hit.memory.render()}")
        lines.append("")
    return RenderedContext(
        text="\n".join(lines).strip() or NO_MEMORIES,
        short_ids=short_ids,
        memory_texts=memory_texts,
        window_turns=window_turns,
        turn_ids=list(provenance),
    )


def _window_blocks(windows: list[EvidenceWindow]) -> list[tuple[str, list[Turn], list[str]]]:
    """Merge windows into runs of consecutive turns: (short id, turns, lines), chronologically.

    Sessions go by date; each gets one date header, and each run of its turns a short id.
    """
    sessions: dict[str, tuple[EvidenceWindow, dict[int, Turn]]] = {}
    for window in windows:
        _, turns = sessions.setdefault(window.session_id, (window, {}))
        turns.update(zip(range(window.start, window.start + len(window.turns)), window.turns, strict=True))
    blocks: list[tuple[str, list[Turn], list[str]]] = []
    for first, turns in sorted(sessions.values(), key=lambda pair: (pair[0].session_date, pair[0].session_id)):
        header = [_session_header(first)]
        run: list[int] = []
        for position in sorted(turns) + [None]:
            if run and (position is None or position != run[-1] + 1):
                short = f"W{len(blocks) + 1}"
                block_turns = [turns[p] for p in run]
                block_lines = [f"[{short}] {turn_line(block_turns[0])}"] + [turn_line(t) for t in block_turns[1:]]
                blocks.append((short, block_turns, header + block_lines))
                header, run = [], []
            if position is not None:
                run.append(position)
    return blocks
