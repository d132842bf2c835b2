"""The curated memories' precision: a seeded random sample of them beside their source turns,
classed by a reviewer, and a cheap check for the commonest error.

    sample = draw_memories(memories, conversations, size=100, seed=0)   # MemorySample rows
    hybridmem eval memory-sample --data locomo.json --stores STORES --out STUDY/memory_precision.jsonl

Each row shows a memory (as the answer model sees it) with the turns it cites, speaker and
text, for a person (or a careful reviewer) to fill ``label`` with one of :data:`LABELS`.
Recall (does a memory carry the fact a question needs?) is what the benchmark scores; this
measures the other side: is what a memory says true of its turns?

``unsupported_subjects`` is the cheap check (``text/attribution.py``): the people a memory is
about of whom none of its cited turns speaks (in the first person, by name, or addressed as
"you"). Reading the memories found this class first: one person's news given to the other.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Literal

from hybridmem_local.eval.systems import EvalConversation
from hybridmem_local.schema import Episode, RelationalTuple, StrictModel
from hybridmem_local.text.attribution import unsupported_subjects

MEMORY_PRECISION = "memory_precision.jsonl"
Label = Literal["right", "wrong_speaker", "invented_detail", "wrong_date", "not_in_turns"]
LABELS: tuple[Label, ...] = ("right", "wrong_speaker", "invented_detail", "wrong_date", "not_in_turns")


class SourceTurn(StrictModel):
    turn_id: str
    speaker: str
    text: str
    image_caption: str | None = None


class MemorySample(StrictModel):
    """One sampled memory, its source turns, the cheap check's finding and a reviewer's label."""

    conversation_id: str
    memory_id: int
    kind: Literal["episode", "tuple"]
    memory: str
    timestamp: str
    session_date: str | None
    source_turns: list[SourceTurn]
    #: People the memory is about of whom no cited turn speaks (``text/attribution.py``).
    unsupported_subjects: list[str]
    label: Label | None = None
    note: str | None = None


def draw_memories(
    memories: Mapping[str, Sequence[Episode | RelationalTuple]],
    conversations: Sequence[EvalConversation],
    size: int,
    seed: int,
) -> list[MemorySample]:
    """``size`` memories drawn uniformly from every conversation's (``memories`` by conversation
    id), each with its cited turns; in conversation and id order."""
    pool = [(c, m) for c in conversations for m in memories.get(c.conversation_id, [])]
    picked = sorted(random.Random(seed).sample(range(len(pool)), min(size, len(pool))))
    rows = []
    for conversation, memory in (pool[i] for i in picked):
        turns = {t.turn_id: t for s in conversation.sessions for t in s.turns}
        dates = {t.turn_id: s.started_at for s in conversation.sessions for t in s.turns}
        cited = [turns[t] for t in memory.source_turn_ids if t in turns]
        people = sorted({t.speaker for t in turns.values()})
        rows.append(
            MemorySample(
                conversation_id=conversation.conversation_id,
                memory_id=memory.stored_id,
                kind=memory.kind,
                memory=memory.render(),
                timestamp=str(memory.timestamp),
                session_date=str(dates[cited[0].turn_id].date()) if cited else None,
                source_turns=[
                    SourceTurn(turn_id=t.turn_id, speaker=t.speaker, text=t.text, image_caption=t.image_caption)
                    for t in cited
                ],
                unsupported_subjects=sorted(unsupported_subjects(memory, cited, people)),
            )
        )
    return rows


def summarise_precision(rows: Sequence[dict]) -> dict:
    """Labels counted (with the share of labelled rows), and how the cheap check does on them:
    how many ``wrong_speaker`` memories it flags, how many right ones it flags by mistake, and
    the precision of the memories it would keep."""
    from hybridmem_local.eval.metrics import score_interval

    labelled = [r for r in rows if r.get("label") is not None]
    right = [r["label"] == "right" for r in labelled]
    interval = score_interval(right)
    flagged = [bool(r.get("unsupported_subjects")) for r in labelled]
    wrong_speaker = [f for r, f in zip(labelled, flagged, strict=True) if r["label"] == "wrong_speaker"]
    correct = [f for r, f in zip(labelled, flagged, strict=True) if r["label"] == "right"]
    return {
        "sampled": len(rows),
        "labelled": len(labelled),
        "precision": sum(right) / len(right) if right else None,
        "ci95": None if interval is None else list(interval),
        "labels": {label: sum(r["label"] == label for r in labelled) for label in LABELS},
        "check_flags_wrong_speaker": f"{sum(wrong_speaker)} of {len(wrong_speaker)}",
        "check_flags_right": f"{sum(correct)} of {len(correct)}",
        "check_flags_other_wrong": sum(
            f for r, f in zip(labelled, flagged, strict=True) if r["label"] not in ("right", "wrong_speaker")
        ),
        "precision_kept_by_check": _share(
            [r["label"] == "right" for r, f in zip(labelled, flagged, strict=True) if not f]
        ),
    }


def _share(values: Sequence[bool]) -> float | None:
    return sum(values) / len(values) if values else None
