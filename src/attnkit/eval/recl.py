"""Relative effective context length, RECL (Dai et al. 2019, section 4.3 and the appendix "Details about RECL").

The gain of a longer context is measured for a group of models against one shared baseline, the group's best loss
at the shorter context, and only on the tokens that baseline finds hardest. N models m_1 .. m_N, each scored on the
same tokens t = 1 .. n of a corpus at every context length c (here the attention length at evaluation):

    l_i(c, t)   = -log P_i(x_t | x_{t-1}, ..., x_{t-c})        the loss of model i on token t with context c
    b(c, t)     = min_i l_i(c, t)                              the baseline: the group's best loss at context c
    T_r(c)      = the ceil(r * n) tokens with the largest b(c, t) (ties: the earlier token first)
    f_i(c, c')  = 1 / |T_r(c)| * sum_{t in T_r(c)} min(b(c, t), l_i(c', t))      for a longer context c' > c
    g_i(c, c')  = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)                the relative gain

f_i(c, c) is the mean of b(c, t) over T_r(c), the same for every model: every model with the longer context must
improve on the same baseline, and only losses below it count (a loss above it counts as the baseline's). The
relative gain is the relative perplexity reduction on the hard tokens. RECL of model i, with a threshold (the
paper's: 0.01): start at the shortest context c; while g_i(c, c') >= threshold for the next context c' = c + Delta,
set c = c'; RECL_i is the c where the gain first falls below the threshold. Delta is the step between consecutive
contexts of the grid (any increasing grid works; the paper's is uniform). A model whose gain holds up to the
longest context gets that context: a lower bound, as the grid ends there.

Pure numpy: the losses are given, nothing is evaluated here (attnkit.experiments.lm_ablation does that).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

Losses = Mapping[str, Mapping[int, np.ndarray]]  # model -> context length -> per-token losses (n,), in nats


def _as_grid(losses: Losses) -> tuple[list[int], dict[str, dict[int, np.ndarray]]]:
    """The sorted contexts every model shares and the losses as flat float64 arrays of one length."""
    if not losses:
        raise ValueError("RECL needs at least one model")
    contexts = sorted(next(iter(losses.values())))
    arrays: dict[str, dict[int, np.ndarray]] = {}
    for name, by_context in losses.items():
        if sorted(by_context) != contexts:
            raise ValueError(f"model {name!r} is scored at contexts {sorted(by_context)}, another at {contexts}")
        arrays[name] = {c: np.asarray(v, dtype=np.float64).ravel() for c, v in by_context.items()}
    sizes = {a.size for by_context in arrays.values() for a in by_context.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every model and context must score the same number of tokens (> 0), not {sorted(sizes)}")
    if len(contexts) < 2:
        raise ValueError(f"RECL compares contexts: give at least two, not {contexts}")
    return contexts, arrays


def relative_gains(losses: Losses, r: float) -> dict[str, list[tuple[int, int, float]]]:
    """g_i(c, c') for every model and every pair of consecutive contexts: model -> [(c, c', gain), ...]."""
    if not 0.0 < r <= 1.0:
        raise ValueError(f"r is a fraction of the tokens, in (0, 1], not {r}")
    contexts, arrays = _as_grid(losses)
    n = next(iter(next(iter(arrays.values())).values())).size
    hard_count = max(1, math.ceil(r * n))
    gains: dict[str, list[tuple[int, int, float]]] = {name: [] for name in arrays}
    for short, long in zip(contexts, contexts[1:]):
        baseline = np.min([by_context[short] for by_context in arrays.values()], axis=0)  # b(c, t), (n,)
        hard = np.argsort(-baseline, kind="stable")[:hard_count]  # T_r(c)
        base_ppl = math.exp(baseline[hard].mean())  # exp f_i(c, c)
        for name, by_context in arrays.items():
            ppl = math.exp(np.minimum(baseline[hard], by_context[long][hard]).mean())  # exp f_i(c, c')
            gains[name].append((short, long, (base_ppl - ppl) / base_ppl))
    return gains


def recl(losses: Losses, r: float, threshold: float = 0.01) -> dict[str, int]:
    """Relative effective context length of every model of the group `losses` (model -> context -> per-token
    losses on the same tokens), on the fraction r of hardest tokens: see the module docstring."""
    out = {}
    for name, steps in relative_gains(losses, r).items():
        context = steps[0][0]
        for _, longer, gain in steps:
            if gain < threshold:
                break
            context = longer
        out[name] = context
    return out
