"""The write-time guard against duplicate curated memories.

A weak curation model writes the same memory several times (SmolLM2 stored one episode three
times and one tuple six times in a session of the demo). A new memory that repeats an active
memory of the same kind in its namespace is therefore not stored again: the existing row gains
the new memory's source turns instead (``store.memories.add_source_turns``, a ``duplicate`` event).
A repeat is

* **exact**: the same content once case, punctuation and spacing are set aside
  (:func:`content_key`), or
* **near**: the cosine of the two embedded index texts (what dense search embeds) is at least
  ``curation.duplicate_cosine`` (measured by ``scripts/bench_duplicates.py``) *and* both
  carry the same numbers: MiniLM hardly sees them ("Bob ran the 10K in 52 minutes" and "... in
  61 minutes" have cosine 0.96; as tuples 0.995), and a number is often the whole fact.

Both compare a memory's content without the turn ids and list numbers small models prefix to
copies ("D1:36: VR gaming is awesome!" and "D1:37: VR gaming is awesome!"; "1. Use a pizza
dough ..." and "2. Use a pizza dough ...", both written by SmolLM2 in LoCoMo sessions).

Only memories that could be the same record are compared: those with the same timestamp, and
those of the same session (a model restating a memory of the session under another date). The
same text at two dates is two events ("went to the support group" in May and in July).
Repeats within one batch of new memories are caught the same way. This is the cheap guard;
consolidation still does the semantic merging of memories that say the same in other words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from hybridmem_local.schema import (
    LIST_MARKER,
    TURN_REFERENCE,
    Episode,
    EpisodeDraft,
    MemoryKind,
    Provenance,
    RelationalTuple,
    TupleDraft,
)
from hybridmem_local.storage.store import MemoryStore
from hybridmem_local.text.alignment import content_text

Draft = EpisodeDraft | TupleDraft
_NON_WORD = re.compile(r"[\W_]+")
_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")

#: Active memories of a kind that a new memory with this timestamp could repeat
#: (``store.memories.duplicate_candidates`` with the namespace and session filled in).
Candidates = Callable[[MemoryKind, str], list[Episode | RelationalTuple]]
#: Vectors of index texts (from the embedding cache where it has them).
Vectors = Callable[[Sequence[str]], np.ndarray]


def compared_text(memory: Draft) -> str:
    """A memory's content fields (not its timestamp or provenance) without turn-id references
    and the list markers that start a field."""
    return TURN_REFERENCE.sub(" ", LIST_MARKER.sub("", content_text(memory)))


def content_key(memory: Draft) -> str:
    """:func:`compared_text` lower-cased, with every run of punctuation and spacing made one space."""
    return _NON_WORD.sub(" ", compared_text(memory).lower()).strip()


def numbers(memory: Draft) -> set[str]:
    """The numbers :func:`compared_text` carries (times, amounts, counts, dates in the text)."""
    return set(_NUMBER.findall(compared_text(memory)))


def kind_of(memory: Draft) -> MemoryKind:
    return "episode" if isinstance(memory, EpisodeDraft) else "tuple"


#: Where a planned memory is: ("new", index into ``DuplicatePlan.new``) or ("existing", memory id).
Slot = tuple[Literal["new", "existing"], int]


class Repeat(BaseModel):
    """A new memory that is not stored: the row it repeats gains its source turns."""

    model_config = ConfigDict(extra="forbid")

    #: Where the repeated memory is.
    of: Slot
    turn_ids: list[str]
    provenance: Provenance | None
    #: Why it is a repeat (the history event's reason).
    reason: str


@dataclass
class DuplicatePlan:
    """What to write for a batch of new memories once repeats are set aside."""

    #: Memories to insert.
    new: list[Draft] = field(default_factory=list)
    #: Per input memory, where it is.
    slots: list[Slot] = field(default_factory=list)
    repeats: list[Repeat] = field(default_factory=list)


def plan_duplicates(
    memories: Sequence[Draft],
    vectors: Sequence[np.ndarray],
    candidates: Candidates,
    vectors_of: Vectors,
    threshold: float,
    same_session: bool,
) -> DuplicatePlan:
    """Sort a batch of new memories (with the vectors of their index texts) into new rows and
    repeats. ``same_session``: the batch comes from one session, so its memories are compared
    whatever their timestamps."""
    plan = DuplicatePlan()
    new_vectors: list[np.ndarray] = []
    for memory, vector in zip(memories, vectors, strict=True):
        key = content_key(memory)
        match = _in_batch(plan.new, new_vectors, memory, vector, key, threshold, same_session)
        if match is None:
            match = _in_store(memory, candidates(kind_of(memory), memory.timestamp), vectors_of, vector, key, threshold)
        if match is None:
            plan.slots.append(("new", len(plan.new)))
            plan.new.append(memory)
            new_vectors.append(vector)
            continue
        of, reason = match
        plan.slots.append(of)
        plan.repeats.append(Repeat(of=of, turn_ids=memory.source_turn_ids, provenance=memory.provenance, reason=reason))
    return plan


def _similarity(memory: Draft, key: str, other: Draft, cosine: float) -> tuple[float, str]:
    """How alike two memories are: 2 for the same content (outranks any cosine), else the
    cosine, or -1 when their numbers differ (a near match must not lose a number)."""
    if key == content_key(other):
        return 2.0, "the same content"
    if numbers(memory) != numbers(other):
        return -1.0, "different numbers"
    return cosine, f"cosine {cosine:.3f} of the index texts"


def _in_batch(
    new: list[Draft],
    new_vectors: list[np.ndarray],
    memory: Draft,
    vector: np.ndarray,
    key: str,
    threshold: float,
    same_session: bool,
) -> tuple[Slot, str] | None:
    best: tuple[float, int, str] | None = None
    for index, (other, other_vector) in enumerate(zip(new, new_vectors, strict=True)):
        if kind_of(other) != kind_of(memory) or not (same_session or other.timestamp == memory.timestamp):
            continue
        score, why = _similarity(memory, key, other, float(other_vector @ vector))
        if score >= threshold and (best is None or score > best[0]):
            best = (score, index, why)
    return None if best is None else (("new", best[1]), f"repeats a memory written with it ({best[2]})")


def _in_store(
    memory: Draft,
    stored: list[Episode | RelationalTuple],
    vectors_of: Vectors,
    vector: np.ndarray,
    key: str,
    threshold: float,
) -> tuple[Slot, str] | None:
    if not stored:
        return None
    cosines = vectors_of([m.index_text() for m in stored]) @ vector
    scored = [_similarity(memory, key, m, float(c)) for m, c in zip(stored, cosines, strict=True)]
    best = max(range(len(stored)), key=lambda i: scored[i][0])
    if scored[best][0] < threshold:
        return None
    return ("existing", stored[best].stored_id), f"repeats memory {stored[best].stored_id} ({scored[best][1]})"


def fold_repeats(store: MemoryStore, plan: DuplicatePlan, new_ids: Sequence[int]) -> list[int]:
    """Once ``plan.new`` is inserted as ``new_ids``: give each repeated row the source turns of
    its repeats (one ``duplicate`` event each; inside the caller's transaction) and return, per
    planned memory, the id of the row that holds it."""

    def row(of: tuple[str, int]) -> int:
        where, index = of
        return new_ids[index] if where == "new" else index

    for repeat in plan.repeats:
        store.memories.add_source_turns(row(repeat.of), repeat.turn_ids, repeat.provenance, reason=repeat.reason)
    return [row(slot) for slot in plan.slots]
