"""Answer metrics (LoCoMo's official F1, mem0-style F1 and BLEU-1) and retrieval recall.

* :func:`f1_official` reproduces ``f1_score`` / ``f1`` / ``eval_question_answering`` of
  snap-research/LoCoMo ``task_eval/evaluation.py``, category rules included.
* :func:`f1_mem0` and :func:`bleu1` reproduce ``calculate_metrics`` / ``calculate_bleu_scores``
  of mem0's ``evaluation/metrics/utils.py`` (the F1 and BLEU columns of memory-system papers).
  One deliberate difference: mem0 tokenises for BLEU with ``nltk.word_tokenize``, which first
  splits sentences with the downloadable ``punkt`` model; here NLTK's word tokenizer (the one
  ``word_tokenize`` applies to each sentence) runs on the whole text, so no NLTK data is ever
  needed. The two differ only on a period that ends a sentence inside the text ("stop. she"
  keeps "stop." as one token); answers are mostly one sentence.
* Retrieval metrics work on provenance: a retrieved memory carries the turn ids it came from.
  A question without evidence is *not scorable* (``None``); :func:`aggregate` leaves such
  values out of every mean and counts them.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np
from nltk.stem import PorterStemmer
from nltk.tokenize import NLTKWordTokenizer
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from hybridmem_local.errors import InvalidInputError
from hybridmem_local.schema import StrictModel

_stemmer = PorterStemmer()
_PUNCTUATION = set(string.punctuation)
_ARTICLES_AND = re.compile(r"\b(a|an|the|and)\b")
_word_tokenizer = NLTKWordTokenizer()
_ADVERSARIAL_PHRASES = ("no information available", "not mentioned")

# --------------------------------------------------------------------------- LoCoMo official F1


def normalize_answer(text: str) -> str:
    """LoCoMo's normaliser: drop commas, lowercase, drop punctuation, articles and "and"."""
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES_AND.sub(" ", text)
    return " ".join(text.split())


def _stemmed_tokens(text: str) -> list[str]:
    return [_stemmer.stem(word) for word in normalize_answer(text).split()]


def token_f1(prediction: str, gold: str) -> float:
    """Token F1 over Porter-stemmed, normalised tokens (LoCoMo ``f1_score``); 0 without overlap."""
    prediction_tokens = _stemmed_tokens(prediction)
    gold_tokens = _stemmed_tokens(gold)
    same = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(prediction_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str) -> float:
    """LoCoMo ``f1`` for multi-hop answers: both sides split on ','; each gold part is scored
    by its best-matching prediction part, and the gold parts are averaged."""
    predictions = [p.strip() for p in prediction.split(",")]
    golds = [g.strip() for g in gold.split(",")]
    return sum(max(token_f1(p, g) for p in predictions) for g in golds) / len(golds)


def f1_official(prediction: str, gold: str, category: int) -> float:
    """The LoCoMo paper's QA score for one answer, by question category.

    1 multi-hop: :func:`multi_answer_f1`; 2 temporal and 4 single-hop: :func:`token_f1`;
    3 open-domain: :func:`token_f1` against the gold text before its first ';';
    5 adversarial: 1.0 when the prediction says "no information available" or "not mentioned"
    (the gold answer is not used).
    """
    if category in (2, 4):
        return token_f1(prediction, gold)
    if category == 3:
        return token_f1(prediction, gold.split(";")[0].strip())
    if category == 1:
        return multi_answer_f1(prediction, gold)
    if category == 5:
        lowered = prediction.lower()
        return 1.0 if any(phrase in lowered for phrase in _ADVERSARIAL_PHRASES) else 0.0
    raise InvalidInputError(f"LoCoMo category must be 1-5, got {category!r}")


# --------------------------------------------------------------------------- mem0-style F1 and BLEU-1


def _mem0_tokens(text: str) -> set[str]:
    return set(text.lower().replace(".", " ").replace(",", " ").replace("!", " ").replace("?", " ").split())


def f1_mem0(prediction: str, gold: str) -> float:
    """mem0's F1: overlap of the *sets* of lowercased tokens, with only . , ! ? removed."""
    prediction, gold = prediction.strip(), gold.strip()
    if not prediction or not gold:
        return 0.0
    prediction_tokens, gold_tokens = _mem0_tokens(prediction), _mem0_tokens(gold)
    common = prediction_tokens & gold_tokens
    if not prediction_tokens or not gold_tokens or not common:
        return 0.0
    precision = len(common) / len(prediction_tokens)
    recall = len(common) / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def bleu_tokens(text: str) -> list[str]:
    """``nltk.word_tokenize`` of the lowercased text, less its punkt sentence split (see above)."""
    return _word_tokenizer.tokenize(text.lower())


def bleu1(prediction: str, gold: str) -> float:
    """Sentence BLEU-1 with NLTK's smoothing method 1, as in mem0's evaluation."""
    prediction_tokens, gold_tokens = bleu_tokens(prediction), bleu_tokens(gold)
    if not prediction_tokens or not gold_tokens:
        return 0.0
    return float(
        sentence_bleu(
            [gold_tokens],
            prediction_tokens,
            weights=(1, 0, 0, 0),
            smoothing_function=SmoothingFunction().method1,
        )
    )


# --------------------------------------------------------------------------- retrieval


def evidence_recall(covered_turn_ids: Iterable[str], evidence_ids: Sequence[str]) -> bool | None:
    """True when every evidence turn is covered; None when the question has no evidence."""
    if not evidence_ids:
        return None
    covered = set(covered_turn_ids)
    return all(turn_id in covered for turn_id in evidence_ids)


def evidence_recall_at_k(
    ranked_items_provenance: Sequence[Iterable[str]], evidence_ids: Sequence[str], k: int
) -> bool | None:
    """:func:`evidence_recall` over the provenance of the first ``k`` retrieved items."""
    if k < 1:
        raise InvalidInputError(f"k must be at least 1, got {k}")
    covered = {turn_id for item in ranked_items_provenance[:k] for turn_id in item}
    return evidence_recall(covered, evidence_ids)


def session_recall_at_k(
    ranked_session_ids: Sequence[str],
    answer_session_ids: Sequence[str],
    k: int,
    require: Literal["all", "any"] = "all",
) -> bool | None:
    """LongMemEval's session recall: are all (``recall_all``) or any (``recall_any``) of the
    answer sessions among the first ``k`` distinct ranked sessions? None without answer sessions.

    Repeats in the ranking (several memories from one session) count once, as LongMemEval does
    when it lifts turn-level rankings to sessions.
    """
    if k < 1:
        raise InvalidInputError(f"k must be at least 1, got {k}")
    if not answer_session_ids:
        return None
    top = list(dict.fromkeys(ranked_session_ids))[:k]
    hits = [session_id in top for session_id in answer_session_ids]
    return all(hits) if require == "all" else any(hits)


# --------------------------------------------------------------------------- aggregation


class MetricSummary(StrictModel):
    #: Mean of the scorable values; None when there were none.
    mean: float | None
    #: Values averaged.
    count: int
    #: Values that were None (not scorable) and left out.
    skipped: int


class MetricReport(StrictModel):
    overall: MetricSummary
    by_category: dict[str, MetricSummary]


def _summarise(values: list[float | bool | None]) -> MetricSummary:
    scorable = [float(v) for v in values if v is not None]
    return MetricSummary(
        mean=sum(scorable) / len(scorable) if scorable else None,
        count=len(scorable),
        skipped=len(values) - len(scorable),
    )


def aggregate(values: Sequence[float | bool | None], categories: Sequence[str | int] | None = None) -> MetricReport:
    """Mean of per-question values overall and per category, leaving out (and counting) Nones."""
    if categories is not None and len(categories) != len(values):
        raise InvalidInputError(f"{len(values)} values but {len(categories)} categories")
    grouped: dict[str, list[float | bool | None]] = {}
    for category, value in zip(categories, values, strict=True) if categories is not None else ():
        grouped.setdefault(str(category), []).append(value)
    return MetricReport(
        overall=_summarise(list(values)),
        by_category={category: _summarise(group) for category, group in sorted(grouped.items())},
    )


#: Resamples behind :func:`bootstrap_interval`: at 300 questions the interval's ends moved by at
#: most 0.7 points over 50 seeds.
BOOTSTRAP_RESAMPLES = 2000


def bootstrap_interval(
    values: Sequence[float | bool | None], *, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean over questions (Nones left out, as in :func:`aggregate`).

    Questions are resampled with replacement ``resamples`` times with a fixed ``seed``, so a report
    rebuilt from the same predictions shows the same interval. None when nothing is scorable.
    """
    if not 0.0 < level < 1.0:
        raise InvalidInputError(f"level must be between 0 and 1, got {level}")
    scorable = np.array([float(v) for v in values if v is not None])
    if not scorable.size:
        return None
    draws = np.random.default_rng(seed).integers(0, scorable.size, size=(resamples, scorable.size))
    low, high = np.quantile(scorable[draws].mean(axis=1), [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(low), float(high)


def wilson_interval(successes: int, n: int, *, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of the proportion ``successes / n`` (None when ``n`` is 0).

    It stays inside [0, 1] and is not a point when every question went the same way: 0 right of
    7 is 0–35%, where the bootstrap says 0–0, as if 7 questions made the rate certain."""
    if not 0.0 < level < 1.0:
        raise InvalidInputError(f"level must be between 0 and 1, got {level}")
    if not 0 <= successes <= n:
        raise InvalidInputError(f"successes must be between 0 and n, got {successes} of {n}")
    if n == 0:
        return None
    z = NormalDist().inv_cdf((1.0 + level) / 2.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def score_interval(values: Sequence[float | bool | None], *, level: float = 0.95) -> tuple[float, float] | None:
    """The interval of a per-question score's mean (Nones left out): Wilson's when every value is
    0 or 1 (a judge's verdicts, a memory right or not, a recall that is all or nothing), the
    percentile bootstrap over questions for graded scores (F1, BLEU-1)."""
    scorable = [float(v) for v in values if v is not None]
    if scorable and all(v in (0.0, 1.0) for v in scorable):
        return wilson_interval(int(sum(scorable)), len(scorable), level=level)
    return bootstrap_interval(scorable, level=level)


def ratio_interval(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``sum(numerators) / sum(denominators)`` over units resampled
    together (e.g. a run's seconds and the answers it made). None with fewer than two units: one
    run says nothing about how much the next one varies."""
    if len(numerators) != len(denominators):
        raise InvalidInputError(f"ratio needs equal lengths, got {len(numerators)} and {len(denominators)}")
    if len(numerators) < 2:
        return None
    if any(d <= 0 for d in denominators):
        raise InvalidInputError("every denominator of a ratio must be positive")
    top, bottom = np.array(numerators, dtype=float), np.array(denominators, dtype=float)
    draws = np.random.default_rng(seed).integers(0, top.size, size=(resamples, top.size))
    ratios = top[draws].sum(axis=1) / bottom[draws].sum(axis=1)
    low, high = np.quantile(ratios, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(low), float(high)


class PairedDifference(StrictModel):
    """Mean of ``a - b`` over the questions both systems have a value for, with its interval."""

    n: int
    difference: float | None
    ci95: tuple[float, float] | None


def paired_difference(
    a: Sequence[float | bool | None],
    b: Sequence[float | bool | None],
    *,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> PairedDifference:
    """Paired percentile bootstrap of the mean difference: ``a[i]`` and ``b[i]`` are the same
    question answered by two systems, resampled together, so the interval is not widened by how
    hard the questions are (the unpaired intervals of two systems overlap far more)."""
    if len(a) != len(b):
        raise InvalidInputError(f"paired values need equal lengths, got {len(a)} and {len(b)}")
    differences = np.array([float(x) - float(y) for x, y in zip(a, b, strict=True) if x is not None and y is not None])
    if not differences.size:
        return PairedDifference(n=0, difference=None, ci95=None)
    interval = bootstrap_interval(differences.tolist(), level=level, resamples=resamples, seed=seed)
    return PairedDifference(n=int(differences.size), difference=float(differences.mean()), ci95=interval)
