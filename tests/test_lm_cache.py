"""The continuous cache (Grave et al. 2017): against a token-by-token reference, no look-ahead, the mixture, and a
model whose text repeats, which the cache must predict."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.config import TransformerXLConfig
from attnkit.eval.cache import StreamCache, evaluate_cache, mix
from attnkit.eval.lm import evaluate_segments
from attnkit.models import build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def reference(h: torch.Tensor, y: torch.Tensor, size: int, theta: float) -> torch.Tensor:
    """log p_cache(y_t) of one stream, token by token: h (N, D), y (N,) -> (N,), straight from the definition."""
    out = []
    for t in range(len(y)):
        window = range(max(0, t - size), t)  # the `size` states before t
        if not window:
            out.append(-math.inf)
            continue
        weights = torch.softmax(torch.stack([theta * h[t] @ h[i] for i in window]), 0)
        p = sum(w for w, i in zip(weights, window) if y[i] == y[t])
        out.append(math.log(p) if p > 0 else -math.inf)
    return torch.tensor(out)


def streams(b: int = 2, n: int = 15, d: int = 4, vocab: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, n, d, generator=g), torch.randint(vocab, (b, n), generator=g)


@pytest.mark.parametrize("size", [1, 4, 7, 40])
def test_the_cache_matches_the_definition_across_segments_and_streams(size):
    h, y = streams()
    cache, thetas = StreamCache(size), (0.5, 2.0)
    got = torch.cat([cache.log_probs(h[:, s : s + 5], y[:, s : s + 5], thetas) for s in range(0, 15, 5)], dim=2)
    for g, theta in enumerate(thetas):
        for b in range(2):
            torch.testing.assert_close(got[g, b], reference(h[b], y[b], size, theta), rtol=1e-5, atol=1e-5)


def test_no_token_is_scored_with_what_comes_after_it():
    h, y = streams(n=10)
    changed_h, changed_y = h.clone(), y.clone()
    changed_h[:, 6:] += 1.0
    changed_y[:, 7:] = (changed_y[:, 7:] + 1) % 3  # the states from 6 on, the words from 7 on
    a = StreamCache(8).log_probs(h, y, (1.0,))
    b = StreamCache(8).log_probs(changed_h, changed_y, (1.0,))
    torch.testing.assert_close(a[..., :6], b[..., :6])
    assert not torch.equal(a[..., 6:], b[..., 6:])


def test_the_mixture_is_the_weighted_sum_of_the_two_distributions():
    p, q = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.0, 0.5, 0.5])
    for lam in (0.0, 0.25, 0.9):
        mixed = mix(p.log(), q.log(), lam).exp()
        torch.testing.assert_close(mixed, (1 - lam) * p + lam * q)
        assert mixed.sum().item() == pytest.approx(1.0)


def test_a_repeated_text_is_predicted_by_the_cache_and_lambda_zero_is_the_model():
    torch.manual_seed(0)
    cfg = TransformerXLConfig(kind="vanilla-lm", vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                              dropout=0.0)
    model = build_model("vanilla-lm", cfg).eval()
    period = torch.randint(13, (8,), generator=torch.Generator().manual_seed(3))
    ids = torch.cat([period] * 6 + [period[:1]])  # each segment of 8 reads the same tokens: the same states
    sweep = evaluate_cache(model, ids, size=32, thetas=(0.0, 1.0), lambdas=(0.0, 0.5), tgt_len=8)
    static = evaluate_segments(model, ids, tgt_len=8)
    assert sweep.static.tokens == static.tokens == 48
    assert sweep.static.nll == pytest.approx(static.nll, rel=1e-6)
    assert sweep.nll[1.0, 0.0] == pytest.approx(static.nll, rel=1e-6)  # lambda 0: the model alone
    assert sweep.best() == (1.0, 0.5)
    assert sweep.scores(1.0, 0.5).ppl < 0.5 * static.ppl  # five of six periods are copies of what the cache holds
    assert sweep.nll[1.0, 0.5] < sweep.nll[0.0, 0.5]  # matching states, not just counting words, is what wins
    assert not model.final_norm._forward_hooks  # the hook that read the states is gone
