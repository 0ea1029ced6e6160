"""The continuous cache of Grave et al. 2017 ("Improving Neural Language Models with a Continuous Cache"): a
language model's own recent hidden states, each with the word that followed it, mixed into its predictions.

B streams, T segment length, D hidden size, N cache size, K = N + T keys a segment's queries may see, G thetas.

    p(w | x_1..x_t) = (1 - lambda) p_model(w | h_t) + lambda p_cache(w | h_t)
    p_cache(w | h_t) ∝ sum over i = t - N .. t - 1 of [x_{i+1} = w] exp(theta h_t . h_i)

h_i is the final hidden state that predicts x_{i+1} (what the softmax reads). Nothing is trained: theta (how
sharply a state must match) and lambda (the cache's share) are chosen on validation data; one pass scores every
(theta, lambda) of a grid, since the model's NLL and the cache's match are computed once. Each of the B streams
has its own cache, filled as the stream is read, so no token is scored with a word it has not yet seen. It helps
most where rare words recur within a document (names, places): the paper's WikiText-2 LSTM goes from 99.3 to 68.9.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnkit.cpu import for_inference
from attnkit.eval.lm import LMScores, scored_segments

THETAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # hidden states' dot products differ by model: a wide, log grid
LAMBDAS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4)


class StreamCache:
    """The last N (hidden state, next word) pairs of each of B streams."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a cache holds at least one state, not {size}")
        self.size, self.keys, self.words = size, None, None  # (B, <= N, D), (B, <= N)

    def log_probs(self, h: torch.Tensor, y: torch.Tensor, thetas: Sequence[float]) -> torch.Tensor:
        """h (B, T, D) the states predicting y (B, T) -> (G, B, T) log p_cache(y) for each theta (-inf where no
        cached state was followed by y); then the segment joins the cache."""
        h, t = h.float(), h.size(1)
        b, d = h.shape[0], h.shape[2]
        keys = h.new_zeros(b, 0, d) if self.keys is None else self.keys
        words = y.new_zeros(b, 0) if self.words is None else self.words
        n = keys.size(1)
        context, context_words = torch.cat([keys, h], 1), torch.cat([words, y], 1)  # (B, K, D), (B, K)
        j = torch.arange(n + t, device=h.device)
        query = torch.arange(t, device=h.device)[:, None]
        allowed = (j < n + query) & (j >= n + query - self.size)  # (T, K): the N states before each query
        match = context_words[:, None, :] == y[:, :, None]  # (B, T, K): that state was followed by y
        dots = h @ context.transpose(1, 2)  # (B, T, K)
        out = []
        for theta in thetas:
            scores = (theta * dots).masked_fill(~allowed, -math.inf)
            log_all = torch.logsumexp(scores, -1)  # (B, T)
            log_match = torch.logsumexp(scores.masked_fill(~match, -math.inf), -1)
            out.append(torch.where(torch.isfinite(log_all), log_match - log_all, -math.inf))
        self.keys, self.words = context[:, -self.size :], context_words[:, -self.size :]
        return torch.stack(out)


def mix(model_logp: torch.Tensor, cache_logp: torch.Tensor, lam: float | torch.Tensor) -> torch.Tensor:
    """log((1 - lambda) p_model + lambda p_cache), elementwise from log-probabilities (lambda broadcasts; 0 gives
    the model's own, since log 0 = -inf drops the cache's term)."""
    lam = torch.as_tensor(lam, dtype=model_logp.dtype, device=model_logp.device)
    return torch.logaddexp(torch.log1p(-lam) + model_logp, lam.log() + cache_logp)


@dataclass
class CacheSweep:
    """The model alone and with the cache, for each (theta, lambda), over the same tokens."""

    size: int
    static: LMScores
    nll: dict[tuple[float, float], float]  # summed NLL (nats) per (theta, lambda)

    def best(self) -> tuple[float, float]:
        return min(self.nll, key=self.nll.get)

    def scores(self, theta: float, lam: float) -> LMScores:
        return LMScores(self.nll[theta, lam], self.static.tokens, self.static.seconds)


@torch.no_grad()
def evaluate_cache(model, ids: torch.Tensor, *, size: int, thetas: Sequence[float] = THETAS,
                   lambdas: Sequence[float] = LAMBDAS, tgt_len: int, mem_len: int = 0, clamp_len: int = 0,
                   ext_len: int = 0, batch_size: int = 1, max_tokens: int = 0, device: torch.device | str = "cpu",
                   dtype: str = "float32") -> CacheSweep:
    """Score ids (N,) as `evaluate_segments` does, and with a cache of `size` states for every (theta, lambda)."""
    model = for_inference(model.eval())
    states: list[torch.Tensor] = []  # the final norm's output is what the softmax reads: (B, T', D)
    handle = model.final_norm.register_forward_hook(lambda module, args, out: states.append(out))
    cache, static, n = StreamCache(size), 0.0, 0
    lams = torch.tensor(lambdas, dtype=torch.float32)[:, None, None]  # (L, 1, 1): against (G, 1, B, T)
    totals = torch.zeros(len(thetas), len(lambdas), dtype=torch.float64)  # summed NLL per (theta, lambda)
    start = time.perf_counter()
    try:
        for token, y in scored_segments(model, ids, tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len,
                                        ext_len=ext_len, batch_size=batch_size, device=device, dtype=dtype):
            model_logp, y = -token.float(), y.to(token.device)  # (B, T)
            cached = cache.log_probs(states.pop(), y, thetas)  # (G, B, T)
            static, n = static - model_logp.sum().item(), n + y.numel()
            totals -= mix(model_logp, cached[:, None], lams.to(y.device)).sum((2, 3)).double().cpu()  # (G, L)
            if max_tokens and n >= max_tokens:
                break
    finally:
        handle.remove()
    nll = {(theta, lam): totals[g, k].item() for g, theta in enumerate(thetas) for k, lam in enumerate(lambdas)}
    return CacheSweep(size, LMScores(static, n, time.perf_counter() - start), nll)
