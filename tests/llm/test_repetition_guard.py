"""The llama.cpp repetition guard: a reply whose last tokens are one cycle over and over is ended
(the guard itself; the backend run with SmolLM2 is in test_llm_llamacpp.py)."""

from __future__ import annotations

import numpy as np

from hybridmem_local.llm.llama_batch import loop_period


def test_a_cycle_repeated_past_the_span_is_a_loop_with_its_period():
    assert loop_period([7] * 48) is None  # 48 tokens: the span, but no token before the cycle
    assert loop_period([7] * 49) == 1
    cycle = [11, 12, 13, 14, 15]
    assert loop_period([1, 2, 3] + cycle * 11) == 5  # 55 tokens of a 5-token cycle
    item = list(range(100, 160))  # a 60-token list item: a loop once it ran three times
    assert loop_period(item * 2) is None
    assert loop_period(item * 3) == 60


def test_text_that_repeats_a_word_now_and_then_is_no_loop():
    rng = np.random.default_rng(0)
    prose = rng.integers(0, 50, size=400).tolist()  # a 50-token vocabulary repeats words constantly
    assert loop_period(prose) is None
    # a cycle longer than max_period is not looked for
    assert loop_period(list(range(80)) * 3, max_period=64) is None
