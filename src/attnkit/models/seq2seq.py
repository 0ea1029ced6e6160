"""What every encoder-decoder offers, so searches and trainers never ask which family they hold.

B batch, S source length, T target length, D the output layer's input size, V vocabulary.

Search (greedy, beam, sampling, scoring) calls `encode(src)`, `init_state(encoded)` and `step(tokens, state)`, whose
state `reorder`s its rows. Training calls `features(src, tgt_in)` and `output_layer()`: the loss makes the
(tokens x V) logits from these two a chunk of rows at a time, for the real tokens only, and never holds them whole
(attnkit.train.losses.projected_label_smoothed_nll; tests/test_rnn.py and tests/test_train.py check it equals the loss
of `forward`'s logits). A model that optimises a term beside the likelihood (hard attention's REINFORCE) overrides
`training_features`.
"""

from __future__ import annotations

import torch
from torch import nn


class Seq2Seq(nn.Module):
    """The interface of the Transformer and the RNN encoder-decoders; each family implements it in its own file."""

    def encode(self, src: torch.Tensor, *, need_weights: bool = False):
        """src (B, S) -> the encoder's output, which `init_state` turns into the decoder's first state."""
        raise NotImplementedError

    def init_state(self, encoded):
        raise NotImplementedError

    def step(self, tokens: torch.Tensor, state, *, need_weights: bool = False):
        """Feed one token per row, tokens (B,) -> log-probs (B, V), the next state, attention weights or None."""
        raise NotImplementedError

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) -> the output layer's input (B, T, D): `forward` but for its last product."""
        raise NotImplementedError

    def output_layer(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output layer's weight (V, D) and bias (V,) or None: logits = features @ weight^T + bias."""
        raise NotImplementedError

    def training_features(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor | float]:
        """`features`, and the term the model optimises beside the likelihood, summed over target tokens (0 here).
        The term is not part of the logged loss / nll, which stay comparable across models."""
        return self.features(src, tgt_in), 0.0
