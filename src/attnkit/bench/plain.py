"""The LSTM workload as a plain PyTorch loop writes it: the baseline of attnkit's LSTM LM (docs/speed.md).

The model of PyTorch's word_language_model example (pytorch/examples), which is how most LSTM LMs are written:
embedding, dropout, `nn.LSTM` over time-major (T, B, D) input with dropout between layers, dropout, a linear output
layer tied to the embedding; the state carried from segment to segment, detached (truncated back-propagation
through time). The bench's loop around it (Adam, cross-entropy over the logits) is every toolkit's.

B batch, T segment length, D model dim = LSTM state size, L layers, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.bench.workloads import LMAdapter, LMShape, Mems, Toolkit


class PlainLSTMLM(nn.Module):
    def __init__(self, s: LMShape):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.d_model)
        self.drop = nn.Dropout(s.dropout)
        self.rnn = nn.LSTM(s.d_model, s.d_model, s.layers, dropout=s.dropout if s.layers > 1 else 0.0)
        self.out = nn.Linear(s.d_model, s.vocab)
        self.out.weight = self.embed.weight  # tied, as the example's --tied

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None):
        """x (T, B) -> logits (T, B, V), the new state (h, c): (L, B, D) each."""
        out, state = self.rnn(self.drop(self.embed(x)), state)  # (T, B, D)
        return self.out(self.drop(out)), state


def plain_lstm_forward(model: nn.Module, x: torch.Tensor, mems: Mems, s: LMShape) -> tuple[torch.Tensor, Mems]:
    """x (B, T) -> logits (B, T, V) and the detached state, as the example's `repackage_hidden`."""
    logits, (h, c) = model(x.t(), tuple(mems) if mems else None)  # the example batches time-major
    return logits.transpose(0, 1), [h.detach(), c.detach()]


def toolkit(variant: str = "") -> Toolkit:
    return Toolkit(name="pytorch", version=torch.__version__,
                   lm={"lstm": LMAdapter(PlainLSTMLM, plain_lstm_forward,
                                         "PyTorch's word_language_model example: nn.LSTM time-major, nn.Dropout, "
                                         "tied output layer")})
