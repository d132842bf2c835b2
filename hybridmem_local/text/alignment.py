"""Provenance of curated memories: the turns a memory came from, and how they were found.

A curated memory keeps the ids the curation model cited that name turns of the window it was
shown (provenance ``cited``). A weak model often cites nothing usable (SmolLM2 wrote "13:56"
and "2023-05-07" as turn ids), so a memory left without any is *aligned* to the turns of its
window instead (provenance ``aligned``):

    score(turn) = lexical_weight * lexical + (1 - lexical_weight) * cosine

* ``lexical``: the share of the memory's word stems (stopwords out, as BM25 sees them) that
  the turn's line (``speaker: text``) contains;
* ``cosine``: of the two texts' embeddings (the library's embedder, rows L2-normalised).

The best turn is always kept, so every curated memory leads back to some evidence; further
turns, best first, while their score is at least ``min_score``, up to ``max_turns`` in all.
The defaults come from ``scripts/bench_alignment.py`` (LoCoMo observation facts aligned to their
session, scored against the gold evidence ids; see ``CurationConfig``).

:func:`align` is pure (texts and vectors in, turn ids out), so it serves any (memory
text, candidate turns) pair; :class:`Aligner` adds the embedding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hybridmem_local.schema import EpisodeDraft, TupleDraft, Turn, turn_line
from hybridmem_local.text.stems import tokenize

#: Embeds texts into L2-normalised rows (``Embedder.embed``).
Embed = Callable[[Sequence[str]], np.ndarray]


class AlignmentSettings(BaseModel):
    """How many turns a memory is aligned to, and how they are scored (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(ge=1)
    min_score: float = Field(ge=0.0, le=1.0)
    lexical_weight: float = Field(ge=0.0, le=1.0)


def content_text(memory: EpisodeDraft | TupleDraft) -> str:
    """What a memory is aligned by: an episode's title, summary and details; a tuple's fields."""
    parts: tuple[str, ...]
    if isinstance(memory, EpisodeDraft):
        parts = (memory.title, memory.summary, memory.details)
    else:
        parts = (memory.entity, memory.relation, memory.object, memory.context)
    return "\n".join(dict.fromkeys(p for p in parts if p.strip()))


def lexical_overlap(memory_stems: set[str], turn_stems: Sequence[set[str]]) -> np.ndarray:
    """Per turn, the share of ``memory_stems`` it contains (0 for a memory without stems)."""
    if not memory_stems:
        return np.zeros(len(turn_stems), dtype=np.float32)
    return np.array([len(memory_stems & stems) / len(memory_stems) for stems in turn_stems], dtype=np.float32)


def alignment_scores(
    memory_texts: Sequence[str],
    memory_vectors: np.ndarray,
    turn_texts: Sequence[str],
    turn_vectors: np.ndarray,
    lexical_weight: float,
) -> np.ndarray:
    """Scores of every candidate turn for every memory, shape (memories, turns); higher: more
    likely its source. Vectors are L2-normalised rows, one per text."""
    stems = [set(s) for s in tokenize([*memory_texts, *turn_texts])]
    memory_stems, turn_stems = stems[: len(memory_texts)], stems[len(memory_texts) :]
    lexical = (
        np.stack([lexical_overlap(m, turn_stems) for m in memory_stems])
        if memory_stems
        else np.zeros((0, len(turn_texts)))
    )
    cosine = np.asarray(memory_vectors, dtype=np.float32) @ np.asarray(turn_vectors, dtype=np.float32).T
    return lexical_weight * lexical + (1.0 - lexical_weight) * cosine


def select(scores: np.ndarray, settings: AlignmentSettings) -> list[int]:
    """Positions of the chosen turns, in turn order: the best always, then the next best while
    their score reaches ``min_score``, ``max_turns`` in all."""
    if len(scores) == 0:
        return []
    ranked = np.argsort(-scores, kind="stable")[: settings.max_turns]
    chosen = [int(ranked[0])] + [int(i) for i in ranked[1:] if scores[i] >= settings.min_score]
    return sorted(chosen)


def align(
    memory_texts: Sequence[str],
    memory_vectors: np.ndarray,
    turns: Sequence[Turn],
    turn_vectors: np.ndarray,
    settings: AlignmentSettings,
) -> list[list[str]]:
    """For each memory text, the ids of the turns (of ``turns``) it most likely came from."""
    scores = alignment_scores(
        memory_texts, memory_vectors, [turn_line(t) for t in turns], turn_vectors, settings.lexical_weight
    )
    return [[turns[i].turn_id for i in select(row, settings)] for row in scores]


class Aligner:
    """Aligns memories to candidate turns, embedding both with ``embed``."""

    def __init__(self, embed: Embed, settings: AlignmentSettings):
        self.embed = embed
        self.settings = settings

    def align_all(self, texts: Sequence[str], turns: Sequence[Turn]) -> list[list[str]]:
        """Source turn ids for each memory text (one embedding call for texts and turns together)."""
        if not texts or not turns:
            return [[] for _ in texts]
        vectors = self.embed([*texts, *(turn_line(t) for t in turns)])
        return align(texts, vectors[: len(texts)], turns, vectors[len(texts) :], self.settings)
