"""How diagonal is cross-attention? The share of target tokens whose strongest source position lies
near the proportional diagonal, beside the share uniformly random attention would give.

Target position i (0-based, of |tgt| real tokens) is "on the diagonal" when the arg-max of its
attention over the |src| real source tokens lies within ±width of i * |src| / |tgt|. Under uniformly
random attention the arg-max is uniform over the |src| positions, so the expected share is the
fraction of source positions inside that window: computed exactly, not sampled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnkit.errors import AttnkitError


def diagonal_window(n_tgt: int, n_src: int, width: float = 2.0) -> np.ndarray:
    """(T, S) bool: source position j lies within ±width of target position i's proportional diagonal."""
    diag = np.arange(n_tgt) * n_src / n_tgt  # (T,)
    return np.abs(np.arange(n_src)[None, :] - diag[:, None]) <= width  # (T, S)


def diagonal_hits(attn: np.ndarray, width: float = 2.0) -> tuple[int, float]:
    """attn (T, S) of real tokens -> (target rows whose arg-max is in the window, expected count at random)."""
    n_tgt, n_src = attn.shape
    window = diagonal_window(n_tgt, n_src, width)
    hits = window[np.arange(n_tgt), attn.argmax(-1)]
    return int(hits.sum()), float(window.mean(1).sum())


@dataclass
class DiagonalStats:
    shares: list[float]  # per layer, heads averaged
    best_head: list[tuple[int, float]]  # per layer: (head, its share), the most diagonal single head
    random_share: float  # the same for every layer: it depends only on the sentence lengths
    n_tokens: int
    n_sentences: int

    def table(self) -> str:
        lines = [f"{self.n_sentences} sentences, {self.n_tokens} target tokens; arg-max within ±2 of the "
                 f"proportional diagonal (uniformly random attention: {self.random_share:.3f})",
                 "layer  heads averaged  x random  best head"]
        for layer, (share, (head, best)) in enumerate(zip(self.shares, self.best_head), 1):
            ratio = share / self.random_share if self.random_share else float("nan")
            lines.append(f"{layer:>5}  {share:>14.3f}  {ratio:>7.2f}x  {head + 1}: {best:.3f}")
        return "\n".join(lines)


def diagonal_stats(views, kind: str = "cross", width: float = 2.0) -> DiagonalStats:
    """Per-layer diagonal shares over many sentences' AttentionViews (real tokens only)."""
    views = [v for v in views if min(v.content.get(kind, v.layers(kind)[0].shape[1:])) > 0]
    if not views:
        raise AttnkitError("no sentence with both source and target tokens to measure")
    n_layers, n_heads = len(views[0].layers(kind)), views[0].layers(kind)[0].shape[0]
    hits = np.zeros(n_layers)
    head_hits = np.zeros((n_layers, n_heads))
    expected, tokens = 0.0, 0
    for v in views:
        rows, cols = v.content.get(kind, v.layers(kind)[0].shape[1:])
        for layer, m in enumerate(v.layers(kind)):
            m = m[:, :rows, :cols]  # (H, T, S) real tokens only
            hits[layer] += diagonal_hits(m.mean(0), width)[0]
            head_hits[layer] += [diagonal_hits(h, width)[0] for h in m]
        expected += diagonal_hits(np.ones((rows, cols)), width)[1]
        tokens += rows
    best = [(int(h.argmax()), float(h.max() / tokens)) for h in head_hits]
    return DiagonalStats([float(h / tokens) for h in hits], best, expected / tokens, tokens, len(views))
