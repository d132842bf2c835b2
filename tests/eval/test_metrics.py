"""Answer and retrieval metrics against hand-checked cases."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybridmem_local.eval.metrics import (
    aggregate,
    bleu1,
    bleu_tokens,
    bootstrap_interval,
    evidence_recall,
    evidence_recall_at_k,
    f1_mem0,
    f1_official,
    normalize_answer,
    ratio_interval,
    score_interval,
    session_recall_at_k,
    token_f1,
    wilson_interval,
)

# --------------------------------------------------------------------------- LoCoMo official F1


def test_normalize_answer_drops_commas_punctuation_articles_and_and():
    assert normalize_answer("The cat, and a dog!") == "cat dog"
    assert normalize_answer("  An  apple;  THE pear ") == "apple pear"
    # "and"/"the" inside words are kept: only whole words go.
    assert normalize_answer("Andrew thesis") == "andrew thesis"


def test_token_f1_stems_words():
    assert token_f1("paintings", "painting") == 1.0
    # pred [she, paint, sunset] vs gold [paint, sunset]: P = 2/3, R = 1 -> F1 = 0.8
    assert token_f1("She painted sunsets", "painting a sunset") == pytest.approx(0.8)


def test_token_f1_counts_repeated_tokens_once_per_match():
    # pred [cat, cat] vs gold [cat]: one match, P = 1/2, R = 1 -> 2/3
    assert token_f1("cat cat", "cat") == pytest.approx(2 / 3)


def test_token_f1_is_zero_without_overlap_or_tokens():
    assert token_f1("dog", "cat") == 0.0
    assert token_f1("", "cat") == 0.0
    assert token_f1("the", "a") == 0.0  # both normalise to nothing


def test_multi_hop_splits_both_sides_on_commas():
    gold = "Psychology, counseling certification"
    # One prediction part; gold parts scored 1/3-precision (0.5) and 2/3-precision (0.8).
    assert f1_official("counseling certification and psychology", gold, 1) == pytest.approx(0.65)
    # The same words scored without splitting (single-hop rule) match perfectly.
    assert f1_official("counseling certification and psychology", gold, 4) == pytest.approx(1.0)
    # Comma-separated prediction parts each find their gold part.
    assert f1_official("psychology, counseling certification", gold, 1) == pytest.approx(1.0)
    # A gold part nobody answers pulls the mean down: (1 + 0) / 2.
    assert f1_official("psychology", gold, 1) == pytest.approx(0.5)


def test_open_domain_uses_gold_before_first_semicolon():
    gold = "Likely no; she has a dog"
    assert f1_official("likely no", gold, 3) == pytest.approx(1.0)
    # Without the cat-3 rule: pred [like, no] vs gold [like, no, she, ha, dog] -> 2*1*0.4/1.4
    assert f1_official("likely no", gold, 4) == pytest.approx(0.8 / 1.4)


def test_adversarial_is_a_phrase_check():
    assert f1_official("No information available about that.", "anything", 5) == 1.0
    assert f1_official("That was NOT MENTIONED in the conversation", "x", 5) == 1.0
    assert f1_official("Yes, she did", "No", 5) == 0.0


def test_unknown_category_is_an_error():
    with pytest.raises(ValueError, match="category must be 1-5"):
        f1_official("a", "a", 6)


@given(st.text(max_size=40), st.text(max_size=40))
def test_token_f1_is_a_symmetric_score_in_unit_interval(a, b):
    score = token_f1(a, b)
    assert 0.0 <= score <= 1.0
    assert score == pytest.approx(token_f1(b, a))


# --------------------------------------------------------------------------- mem0 F1 and BLEU-1


def test_f1_mem0_is_set_overlap_without_stemming():
    # {the, cat, sat} vs {the, cat, sat, on, mat}: P = 1, R = 3/5 -> 0.75
    assert f1_mem0("The cat sat.", "the cat sat on the mat") == pytest.approx(0.75)
    assert f1_mem0("the the cat", "the cat") == 1.0  # sets, not multisets
    assert f1_mem0("paintings", "painting") == 0.0  # no stemming
    assert f1_mem0("cat;", "cat") == 0.0  # only . , ! ? are stripped
    assert f1_mem0("", "cat") == 0.0
    assert f1_mem0("cat", "   ") == 0.0


def test_bleu_tokens_split_punctuation_without_nltk_data():
    assert bleu_tokens("Paris, France.") == ["paris", ",", "france", "."]


def test_bleu_tokens_follow_treebank_rules_like_word_tokenize():
    # a date written with hyphens is one token, so it shares no unigram with "7 May 2023"
    assert bleu_tokens("2023-07-10") == ["2023-07-10"]
    assert bleu1("2023-07-10", "7 May 2023") == 0.0
    assert bleu_tokens("Don't stop") == ["do", "n't", "stop"]


def test_bleu1_brevity_penalty_and_precision():
    assert bleu1("a b c d", "a b c d") == pytest.approx(1.0)
    # Unigram precision 1, brevity penalty exp(1 - 4/2).
    assert bleu1("a b", "a b c d") == pytest.approx(math.exp(-1))
    # Longer than the reference: no penalty, precision 1/2.
    assert bleu1("Paris.", "paris") == pytest.approx(0.5)


def test_bleu1_smoothing_handles_a_one_word_prediction_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # unsmoothed NLTK warns about missing 2-grams here
        assert bleu1("cat", "the cat") == pytest.approx(math.exp(1 - 2 / 1))


def test_bleu1_is_zero_for_empty_or_disjoint_predictions():
    assert bleu1("", "the cat") == 0.0
    assert bleu1("dog", "the cat") == 0.0


# --------------------------------------------------------------------------- retrieval


def test_evidence_recall_needs_every_evidence_turn():
    assert evidence_recall({"D1:1", "D1:2"}, ["D1:1"]) is True
    assert evidence_recall({"D1:1", "D1:2"}, ["D1:1", "D2:3"]) is False
    assert evidence_recall({"D1:1"}, []) is None


def test_evidence_recall_at_k_unions_the_top_k_provenance():
    ranked = [{"D1:1"}, {"D2:3", "D2:4"}, {"D5:1"}]
    evidence = ["D1:1", "D2:4"]
    assert evidence_recall_at_k(ranked, evidence, 1) is False
    assert evidence_recall_at_k(ranked, evidence, 2) is True
    assert evidence_recall_at_k(ranked, evidence, 10) is True
    assert evidence_recall_at_k(ranked, ["D9:9"], 3) is False
    assert evidence_recall_at_k(ranked, [], 3) is None
    with pytest.raises(ValueError, match="k must be at least 1"):
        evidence_recall_at_k(ranked, evidence, 0)


def test_session_recall_at_k_counts_distinct_sessions():
    ranked = ["s3", "s3", "s1", "s2"]
    assert session_recall_at_k(ranked, ["s1", "s2"], 2) is False  # top-2 distinct: s3, s1
    assert session_recall_at_k(ranked, ["s1", "s2"], 2, require="any") is True
    assert session_recall_at_k(ranked, ["s1", "s2"], 3) is True
    assert session_recall_at_k(ranked, [], 3) is None


def test_aggregate_skips_and_counts_unscorable_values():
    report = aggregate([1.0, 0.0, None, True, 0.5], [1, 1, 2, 2, 4])
    assert report.overall.mean == pytest.approx(2.5 / 4)
    assert (report.overall.count, report.overall.skipped) == (4, 1)
    assert list(report.by_category) == ["1", "2", "4"]
    assert report.by_category["1"].mean == pytest.approx(0.5)
    assert (report.by_category["2"].mean, report.by_category["2"].skipped) == (1.0, 1)
    assert report.by_category["4"].count == 1


def test_aggregate_without_scorable_values_has_no_mean():
    report = aggregate([None, None])
    assert report.overall.mean is None
    assert report.overall.skipped == 2
    assert report.by_category == {}


def test_aggregate_rejects_misaligned_categories():
    with pytest.raises(ValueError, match="3 values but 2 categories"):
        aggregate([1.0, 0.0, 1.0], ["a", "b"])


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_more_questions():
    few = [True] * 6 + [False] * 4
    many = few * 40
    low, high = bootstrap_interval(few)
    assert low < 0.6 < high and low >= 0.0 and high <= 1.0
    low_many, high_many = bootstrap_interval(many)
    assert low_many < 0.6 < high_many
    assert high_many - low_many < (high - low) / 3  # the width shrinks like 1/sqrt(n)
    # The normal approximation at n=400: 0.6 +- 1.96 * sqrt(0.24 / 400) = (0.552, 0.648).
    assert low_many == pytest.approx(0.552, abs=0.01) and high_many == pytest.approx(0.648, abs=0.01)


def test_wilson_interval_matches_the_textbook_and_is_no_point_at_the_ends():
    # Newcombe (1998), Table I: 81 of 263 → 0.2553–0.3662; 0 of 10 → 0–0.2775; 10 of 10 → 0.7225–1.
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    low99, high99 = wilson_interval(81, 263, level=0.99)
    assert low99 < 0.2553 and high99 > 0.3662
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="level"):
        wilson_interval(1, 2, level=95)


def test_score_interval_is_wilsons_for_right_or_wrong_scores_and_the_bootstrap_for_graded_ones():
    verdicts = [True] * 7 + [None]
    assert score_interval(verdicts) == wilson_interval(7, 7)  # 7 right of 7: not certain
    assert score_interval([1.0, 0.0, 0.0, None]) == wilson_interval(1, 3)
    graded = [1.0, 0.0, 0.5, None, 1.0, 0.25]
    assert score_interval(graded) == bootstrap_interval(graded)
    assert score_interval([None]) is None


def test_bootstrap_interval_is_seeded_skips_nones_and_needs_a_value():
    values = [1.0, 0.0, 0.5, None, 1.0, 0.25]
    assert bootstrap_interval(values) == bootstrap_interval(values)
    assert bootstrap_interval(values) == bootstrap_interval([v for v in values if v is not None])
    assert bootstrap_interval([True, True, True]) == (1.0, 1.0)
    assert bootstrap_interval([None, None]) is None
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval([1.0], level=95)


def test_ratio_interval_resamples_units_whole_and_needs_two():
    seconds, answers = [300.0, 660.0, 400.0], [10, 20, 10]  # 30, 33 and 40 s per answer
    low, high = ratio_interval(seconds, answers)
    assert 30.0 <= low < sum(seconds) / sum(answers) < high <= 40.0
    assert ratio_interval(seconds, answers) == (low, high)  # seeded
    assert ratio_interval([300.0, 600.0], [10, 20]) == pytest.approx((30.0, 30.0))  # runs that agree
    assert ratio_interval([300.0], [10]) is None  # one run says nothing about the next
    with pytest.raises(ValueError, match="equal lengths"):
        ratio_interval([1.0, 2.0], [1])
    with pytest.raises(ValueError, match="positive"):
        ratio_interval([1.0, 2.0], [1, 0])
