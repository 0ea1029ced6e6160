"""Relative effective context length (attnkit.eval.recl) on synthetic groups whose answer is known by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnkit.eval.recl import recl, relative_gains

CONTEXTS = (100, 200, 300, 400, 500)


def group(hard: int = 50, easy: int = 50) -> dict[str, dict[int, np.ndarray]]:
    """Two models on `hard` tokens (loss 4 at context 100) and `easy` ones (loss 0.5 everywhere, for both).

    On the hard tokens, `long` gains 0.5 nats per 100 tokens of context up to 300 and nothing beyond; `short`
    gains 0.5 up to 200 only. So the group's baseline is 4.0 at 100, 3.5 at 200 (both), 3.0 at 300 (`long`).
    """

    def losses(last_gain: int) -> dict[int, np.ndarray]:
        out = {}
        for c in CONTEXTS:
            hard_loss = 4.0 - 0.5 * (min(c, last_gain) - 100) / 100
            out[c] = np.concatenate([np.full(hard, hard_loss), np.full(easy, 0.5)])
        return out

    return {"long": losses(300), "short": losses(200)}


def test_recl_of_a_group_with_a_known_answer():
    assert recl(group(), r=0.5) == {"long": 300, "short": 200}
    assert recl(group(), r=0.1) == {"long": 300, "short": 200}


def test_relative_gain_is_the_perplexity_reduction_over_the_groups_baseline_on_the_hardest_tokens():
    gains = relative_gains(group(), r=0.5)  # the 50 hard tokens
    first = dict(((c, c2), g) for c, c2, g in gains["long"])
    assert first[(100, 200)] == pytest.approx(1 - math.exp(-0.5))  # (e^4 - e^3.5) / e^4
    assert first[(300, 400)] == pytest.approx(0.0)
    short = dict(((c, c2), g) for c, c2, g in gains["short"])
    # at 200 the baseline is 3.5 (both models); `short` stays at 3.5 for 300: no gain; `long` reaches 3.0
    assert short[(200, 300)] == pytest.approx(0.0) and first[(200, 300)] == pytest.approx(1 - math.exp(-0.5))
    # at 300 the baseline is `long`'s 3.0: `short` (3.5) counts as the baseline, not as a loss
    assert short[(300, 400)] == pytest.approx(0.0)


def test_r_selects_the_tokens_the_baseline_finds_hardest():
    # on all tokens (r = 1) the easy half dilutes the gain: mean loss 2.25 -> 2.0
    gains = dict(((c, c2), g) for c, c2, g in relative_gains(group(), r=1.0)["long"])
    assert gains[(100, 200)] == pytest.approx(1 - math.exp(-0.25))
    # a model that improves only easy tokens gains nothing on the hard fraction, but does on all tokens
    g = group(hard=10, easy=90)
    g["easy-improver"] = {c: np.concatenate([np.full(10, 4.0), np.full(90, 0.5 - 0.2 * (c > 100))]) for c in CONTEXTS}
    assert recl(g, r=0.1)["easy-improver"] == 100
    assert recl(g, r=1.0)["easy-improver"] == 200


def test_threshold_and_a_gain_up_to_the_longest_context():
    g = group()
    assert recl(g, r=0.5, threshold=0.5) == {"long": 100, "short": 100}  # a gain of 0.39 is not enough
    steady = {c: np.full(10, 5.0 - c / 100) for c in CONTEXTS}
    assert recl({"steady": steady}, r=1.0) == {"steady": 500}  # a lower bound: the grid ends at 500


def test_a_worse_model_never_gains_from_losses_above_the_baseline():
    g = group()
    g["bad"] = {c: np.full(100, 9.0) for c in CONTEXTS}
    assert recl(g, r=0.5)["bad"] == 100
    assert all(gain == pytest.approx(0.0) for _, _, gain in relative_gains(g, r=0.5)["bad"])


def test_the_inputs_are_checked():
    g = group()
    with pytest.raises(ValueError, match="contexts"):
        recl({**g, "odd": {100: np.ones(100), 200: np.ones(100)}}, r=0.1)
    with pytest.raises(ValueError, match="number of tokens"):
        recl({**g, "odd": {c: np.ones(7) for c in CONTEXTS}}, r=0.1)
    with pytest.raises(ValueError, match="r is a fraction"):
        recl(g, r=0.0)
