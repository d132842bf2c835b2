"""Reciprocal rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009).

Each ranking gives an item ``weight / (k + rank)`` (rank from 1); an item's fused score is
the sum over the rankings that hold it. Only ranks are used, so rankings whose scores live
on different scales (cosine similarity, BM25) combine without any calibration, and an item
found by one ranking alone still ranks above items found by none.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from hybridmem_local.errors import InvalidInputError

Item = TypeVar("Item", bound=Hashable)

#: The constant of the original paper; it damps the weight of the very first ranks.
DEFAULT_RRF_K = 60


def reciprocal_rank_fusion(
    rankings: Mapping[str, Sequence[Item]],
    k: int = DEFAULT_RRF_K,
    weights: Mapping[str, float] | None = None,
) -> list[tuple[Item, float]]:
    """Fuse named rankings (best first) into one list of ``(item, fused score)``, best first.

    ``weights`` maps ranking names to non-negative weights (missing names weigh 1); a ranking
    of weight 0 is ignored. Equal fused scores are ordered by the item's best single rank,
    then by the order of ``rankings`` (so with equal weights the first-named ranking wins a
    tie), which makes the result deterministic. An item repeated within one ranking counts
    at its first rank only.
    """
    if k < 1:
        raise InvalidInputError(f"rrf k must be at least 1, got {k}")
    weights = dict(weights or {})
    unknown = set(weights) - set(rankings)
    if unknown:
        raise InvalidInputError(f"weights name rankings that were not given: {sorted(unknown)}")
    if any(w < 0 for w in weights.values()):
        raise InvalidInputError(f"rrf weights must be non-negative, got {weights}")
    scores: dict[Item, float] = {}
    best: dict[Item, tuple[int, int]] = {}
    for position, (name, ranking) in enumerate(rankings.items()):
        weight = weights.get(name, 1.0)
        if weight == 0:
            continue
        seen: set[Item] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
            if item not in best or (rank, position) < best[item]:
                best[item] = (rank, position)
    return sorted(scores.items(), key=lambda pair: (-pair[1], best[pair[0]]))
