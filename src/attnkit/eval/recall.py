"""Planted-recall scores: how well a model predicts the recalled key tokens of attnkit.data.planted, by distance D.

K * Q recalled key tokens (K pairs of keys of Q tokens), V vocabulary.

Only the recalled key tokens are scored, nothing else of the stream: for each, the model's log-probabilities over
the vocabulary at that position become two numbers, its NLL and whether it is ranked first (`token_scores`, the
`reduce` of attnkit.eval.lm.stream_log_probs and window_log_probs). Per distance D:

- loss: the mean NLL of the recalled key tokens, in nats. A model that does not remember the key can at best spread
  its probability over the key pool: log(pool size) nats (`chance_loss`); perfect recall is 0.
- accuracy: the share of recalled key tokens the model ranks strictly first (a tie is not a recall);
  chance 1 / pool size.
- keys: the share of keys whose every token is ranked first.

Pure: the log-probabilities are given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from attnkit.data.planted import Planted


@dataclass(frozen=True)
class RecallRow:
    distance: int
    keys: int  # pairs planted at this distance
    tokens: int  # recalled key tokens scored
    loss: float  # mean nats per recalled key token
    accuracy: float  # share of them ranked strictly first
    whole_keys: float  # share of keys with every token ranked first

    def as_dict(self) -> dict:
        return asdict(self)


def chance_loss(pool_size: int) -> float:
    """The loss of a model that knows the key comes from the pool and nothing more: uniform over it."""
    return math.log(pool_size)


def token_scores(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(k, 2): the NLL of each token under its row of log-probabilities (k, V), and 1.0 where the token is ranked
    strictly first (above every other token: a tie is not a recall), else 0.0."""
    rows = torch.arange(tokens.numel())
    own = log_probs[rows, tokens]  # (k,)
    others = log_probs.clone()
    others[rows, tokens] = -torch.inf
    return torch.stack([-own, (own > others.max(dim=1).values).to(own.dtype)], dim=1)


def recall_scores(planted: Planted, scores: np.ndarray | torch.Tensor) -> list[RecallRow]:
    """One row per distance, ascending. `scores` (K * Q, 2) holds `token_scores` of each recalled key token, in the
    order of `planted.recalled()`."""
    _, _, tokens, distance = planted.recalled()
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (tokens.size, 2):
        raise ValueError(f"{tokens.size} recalled key tokens need ({tokens.size}, 2) scores, not {scores.shape}")
    nll, first = scores[:, 0], scores[:, 1] > 0.5
    whole = first.reshape(-1, planted.key_len).all(axis=1)  # (K,) every token of the key ranked first
    out = []
    for d in sorted(set(distance.tolist())):
        here, keys = distance == d, planted.distance == d
        out.append(RecallRow(int(d), int(keys.sum()), int(here.sum()), float(nll[here].mean()),
                             float(first[here].mean()), float(whole[keys].mean())))
    return out
