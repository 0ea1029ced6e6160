"""Relative effective context length, RECL (Dai et al. 2019, section 4.3 and the appendix "Details about RECL").

The gain of a longer context is measured for a group of models against one shared baseline, the group's best loss
at the shorter context, and only on the tokens that baseline finds hardest. N models m_1 .. m_N, each scored on the
same tokens t = 1 .. n of a corpus at every context length c (the tokens before t it reads: exactly c):

    l_i(c, t)   = -log P_i(x_t | x_{t-1}, ..., x_{t-c})        the loss of model i on token t with context c
    b(c, t)     = min_i l_i(c, t)                              the baseline: the group's best loss at context c
    T_r(c)      = the ceil(r * n) tokens with the largest b(c, t) (ties: the earlier token first)
    f_i(c, c')  = 1 / |T_r(c)| * sum_{t in T_r(c)} min(b(c, t), l_i(c', t))      for a longer context c' > c
    g_i(c, c')  = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)                the relative gain

f_i(c, c) is the mean of b(c, t) over T_r(c), the same for every model: every model with the longer context must
improve on the same baseline, and only losses below it count (a loss above it counts as the baseline's). The
relative gain is the relative perplexity reduction on the hard tokens. RECL of model i, with a threshold (the
paper's: 0.01): start at the shortest context c; while g_i(c, c') >= threshold for the next context c' = c + Delta,
set c = c'; RECL_i is the c where the gain first falls below the threshold. A model whose gain holds up to the
longest context it is scored at gets that context: a lower bound, as its grid ends there.

The grid steps uniformly by Delta (appendix C), and a grid that does not is refused: the gain of one step grows with
the step, so a doubling grid (64, 128, 256, ...) passes the threshold where a uniform one would stop. A model may be
scored on a shorter prefix of the group's grid: the vanilla Transformer only up to its training length, as the paper
scores it (its RECL is then at most that length). At a context where it is not scored it takes no part in the
baseline, and it has no gain beyond its last context.

l_i(c, t) must be the loss with exactly c tokens of context, the same c for every token (not a range of contexts, as
streaming evaluation in segments gives): attnkit.eval.lm.evaluate_windows scores a model so.

Pure numpy: the losses are given, nothing is evaluated here (attnkit.experiments.recl_groups does that).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

Losses = Mapping[str, Mapping[int, np.ndarray]]  # model -> context length -> per-token losses (n,), in nats


def uniform_contexts(delta: int, longest: int, shortest: int = 0) -> list[int]:
    """The contexts shortest, shortest + delta, ... up to longest (shortest defaults to delta)."""
    shortest = shortest or delta
    if delta < 1 or shortest < 1 or longest < shortest + delta:
        raise ValueError(f"RECL's grid needs delta >= 1 and at least two contexts from {shortest} to {longest}, "
                         f"not delta {delta}")
    return list(range(shortest, longest + 1, delta))


def _as_grid(losses: Losses) -> tuple[list[int], dict[str, dict[int, np.ndarray]]]:
    """The group's uniform grid of contexts and every model's losses as flat float64 arrays of one length; each
    model is scored on a prefix of the grid (from its shortest context up to the model's last)."""
    if not losses:
        raise ValueError("RECL needs at least one model")
    contexts = sorted({c for by_context in losses.values() for c in by_context})
    if len(contexts) < 2:
        raise ValueError(f"RECL compares contexts: give at least two, not {contexts}")
    steps = {b - a for a, b in zip(contexts, contexts[1:])}
    if len(steps) != 1:
        raise ValueError(f"RECL steps the context uniformly by Delta (the paper's appendix C), not {contexts}")
    arrays: dict[str, dict[int, np.ndarray]] = {}
    for name, by_context in losses.items():
        if sorted(by_context) != contexts[: len(by_context)] or not by_context:
            raise ValueError(f"model {name!r} is scored at contexts {sorted(by_context)}: not the group's grid "
                             f"{contexts} from its shortest context on")
        arrays[name] = {c: np.asarray(v, dtype=np.float64).ravel() for c, v in by_context.items()}
    sizes = {a.size for by_context in arrays.values() for a in by_context.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every model and context must score the same number of tokens (> 0), not {sorted(sizes)}")
    return contexts, arrays


def relative_gains(losses: Losses, r: float) -> dict[str, list[tuple[int, int, float]]]:
    """g_i(c, c') for every model and every pair of consecutive contexts it is scored at: model -> [(c, c', gain)]."""
    if not 0.0 < r <= 1.0:
        raise ValueError(f"r is a fraction of the tokens, in (0, 1], not {r}")
    contexts, arrays = _as_grid(losses)
    n = next(iter(next(iter(arrays.values())).values())).size
    hard_count = max(1, math.ceil(r * n))
    gains: dict[str, list[tuple[int, int, float]]] = {name: [] for name in arrays}
    for short, long in zip(contexts, contexts[1:]):
        scored = [by_context[short] for by_context in arrays.values() if short in by_context]
        baseline = np.min(scored, axis=0)  # b(c, t), (n,): the best of the models scored at c
        hard = np.argsort(-baseline, kind="stable")[:hard_count]  # T_r(c)
        base_ppl = math.exp(baseline[hard].mean())  # exp f_i(c, c)
        for name, by_context in arrays.items():
            if long in by_context:
                ppl = math.exp(np.minimum(baseline[hard], by_context[long][hard]).mean())  # exp f_i(c, c')
                gains[name].append((short, long, (base_ppl - ppl) / base_ppl))
    return gains


def recl(losses: Losses, r: float, threshold: float = 0.01) -> dict[str, int]:
    """Relative effective context length of every model of the group `losses` (model -> context -> per-token
    losses on the same tokens), on the fraction r of hardest tokens: see the module docstring."""
    shortest = min(c for by_context in losses.values() for c in by_context) if losses else 0
    out = {}
    for name, steps in relative_gains(losses, r).items():
        context = shortest
        for _, longer, gain in steps:
            if gain < threshold:
                break
            context = longer
        out[name] = context
    return out
