"""An LSTM language model: the recurrent baseline of the Transformer-XL paper (its RECL comparison, table 8).

B batch (parallel streams), T segment length, E extended context (ext_len), L layers, D model dim = LSTM state size,
V vocabulary.

The same interface as the Transformer LMs (attnkit.models.transformer_xl): `forward(x, mems=None, targets=y,
mem_len=..., ext_len=...) -> (logits or per-token NLL, new_mems)`, the same (adaptive) embedding scaled by sqrt(D),
the same (tied, adaptive) softmax, so one trainer, one evaluation and one sampler serve them all.

Its memory is its state, not positions: `mems` is [h, c], each (L, B, D), the LSTM's hidden and cell states after
the last token it read, cut from the graph (truncated back-propagation through time, segment by segment, as
AWD-LSTM trains). `mem_len` > 0 carries it to the next segment, 0 starts every segment from zeros; with extended
context the state carried is the one before the last E tokens, which the next segment reads again.

`self.rnn` is a plain `nn.LSTM` with its own dropout between layers. For training on a CPU attnkit.cpu has
`LayerwiseLSTM` (attnkit/cpu/lstm.py), the same cells and Parameters a layer at a time, which can stand in for it
without changing the state dict.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.config import RNNLMConfig
from attnkit.models.transformer_xl import LanguageModel


class LSTMLM(LanguageModel):
    kind = "lstm-lm"

    def __init__(self, config: RNNLMConfig):
        super().__init__(config)
        c = config
        # time-major: (T, B, D) in and out
        self.rnn = nn.LSTM(c.d_model, c.d_model, c.n_layers, dropout=c.dropout if c.n_layers > 1 else 0.0)

    def make_final_norm(self) -> nn.Module:
        return nn.Identity()  # an LSTM's outputs are bounded; the output layer reads them as they are

    def forward(self, x: torch.Tensor, mems: list[torch.Tensor] | None = None, *, targets: torch.Tensor | None = None,
                mem_len: int = 0, clamp_len: int = 0, ext_len: int = 0, need_weights: bool = False):
        """x (B, T), mems [h, c] (L, B, D) each or None -> logits (B, T, V) or, given targets (B, T' <= T), the NLL
        (B, T') of the last T' positions; the new state [h, c] ([] with mem_len 0) [, [] weights: no attention].
        clamp_len is ignored."""
        carried = (mems[0], mems[1]) if mems else None
        h = self.dropout(self.embed_tokens(x.t()))  # (T, B, D)
        keep = max(0, x.size(1) - ext_len) if mem_len > 0 else x.size(1)  # the carried state ends here
        head, tail = h[:keep], h[keep:]
        outs = []
        if head.size(0):
            out, carried = self.run_layers(head, carried)  # (keep, B, D); the state carried on: (L, B, D) x 2
            outs.append(out)
        if tail.size(0):  # the extended context, which the next segment reads again
            outs.append(self.run_layers(tail, carried)[0])
        new_mems = [s.detach() for s in carried] if mem_len > 0 and carried is not None else []
        logits = self.output(torch.cat(outs, dim=0).transpose(0, 1), targets)  # from (B, T, D)
        return (logits, new_mems, []) if need_weights else (logits, new_mems)

    def run_layers(self, h: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None):
        """h (T, B, D), state (h, c) (L, B, D) each or None (zeros) -> the last layer's outputs (T, B, D) and the
        final state (h, c) (L, B, D) each."""
        return self.rnn(h, state)
