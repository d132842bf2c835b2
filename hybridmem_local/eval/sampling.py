"""A stratified, seeded sample of a benchmark's questions, the same whichever shard runs it.

    chosen = stratified_sample(conversations, size=300, seed=0)   # question ids

The strata are (conversation, category). Each gets ``size`` × its share of all questions,
rounded by largest remainder (so the sizes sum to ``size`` exactly and no stratum is more than
one question away from its proportional share); its questions are then drawn with a generator
seeded by ``seed`` and the stratum's name. The sample is drawn over every conversation of the
file before any ``--conversations`` selection, so one conversation run alone (a shard) answers
exactly the questions it answers in a run of all of them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.eval.systems import EvalConversation


def stratified_sample(conversations: Sequence[EvalConversation], size: int, seed: int) -> set[str]:
    """The ids of ``size`` questions of ``conversations``, proportionally from each stratum."""
    strata: dict[tuple[str, str], list[str]] = {}
    for conversation in conversations:
        for question in conversation.questions:
            strata.setdefault((conversation.conversation_id, question.category), []).append(question.question_id)
    total = sum(len(ids) for ids in strata.values())
    if size < 1 or size > total:
        raise InvalidInputError(f"a sample of {size} questions: choose between 1 and {total} (the questions selected)")
    quotas = {stratum: size * len(ids) / total for stratum, ids in strata.items()}
    counts = {stratum: math.floor(quota) for stratum, quota in quotas.items()}
    # Largest remainder first; ties go to the stratum listed first (file order), deterministically.
    order = sorted(strata, key=lambda s: counts[s] - quotas[s])
    for stratum in order[: size - sum(counts.values())]:
        counts[stratum] += 1
    chosen: set[str] = set()
    for (conversation_id, category), ids in strata.items():
        rng = random.Random(f"{seed}:{conversation_id}:{category}")
        chosen.update(rng.sample(ids, counts[(conversation_id, category)]))
    return chosen
