"""Forced decoding: the log-probability a model gives to a given target (rescoring, debugging).

B batch, S source length, T target length.
"""

from __future__ import annotations

import torch

from attnkit.data.tokenizer import PAD_ID
from attnkit.decode.search import search


@search
def score_targets(model, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
    """Summed log P(tgt_out | src) per sentence (B,), EOS included, padding excluded."""
    logp = model(src, tgt_in).float().log_softmax(-1)  # (B, T, V)
    token_logp = logp.gather(2, tgt_out[..., None]).squeeze(2)  # (B, T)
    return token_logp.masked_fill(tgt_out.eq(PAD_ID), 0.0).sum(1)
