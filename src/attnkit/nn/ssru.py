"""The SSRU decoder layer: a Simpler Simple Recurrent Unit in place of the causal self-attention (Kim et al. 2019,
"From Research to Production and Back: Ludicrously Fast Neural Machine Translation"; Marian's `ssru` cell,
src/rnn/cells.h, as the Bergamot / Firefox translation models use it, `transformer-decoder-autoreg: rnn`).

B batch, S source length, T target length, D model dim.

The cell reads each position's input h_t and carries one state c per row:

    x~_t = h_t W              (no bias)
    f_t  = sigmoid(h_t W_f + b_f)
    c_t  = f_t * c_{t-1} + (1 - f_t) * x~_t      (c_0 = 0)
    o_t  = ReLU(c_t)

and the layer is post-norm like the others: LayerNorm(h_t + o_t), then the cross-attention and the FFN blocks of
`DecoderLayer` (`attend_source`, `step_source`). A decoding step carries c (B, D) per layer where the
self-attention carries its keys and values, so a step costs the same at every position. The two maps are the
products; the recurrence is elementwise, so teacher forcing runs it as a plain loop over T (cheap beside the maps,
and the same arithmetic a step does): tests/test_ssru.py checks the whole-target forward against step-by-step
decoding, and that no output reads a later target token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from attnkit.nn.attention import KVCache, MultiHeadAttention
from attnkit.nn.layers import FeedForward, Residual, StepWeights, attend_source, residual, step_source
from attnkit.nn.norms import norm_function


class SSRU(nn.Module):
    """c_t = sigmoid(h_t W_f + b_f) * c_{t-1} + (1 - sigmoid(...)) * h_t W, output ReLU(c_t) (the module docstring).
    `w` holds W and `forget` W_f, b_f as nn.Linear weights (out, in), Marian's [in, out] transposed."""

    def __init__(self, d_model: int):
        super().__init__()
        self.w = nn.Linear(d_model, d_model, bias=False)
        self.forget = nn.Linear(d_model, d_model)
        for lin in (self.w, self.forget):
            nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(self.forget.bias)

    def forward(self, h: torch.Tensor, cell: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h (B, T, D), the state before it (B, D) or None (zeros) -> ReLU(c) (B, T, D), the last c (B, D).

        The maps run over every position at once; the recurrence, elementwise, is a loop over T (see the module
        docstring), each position the same arithmetic as a decoding step."""
        x = self.w(h)  # (B, T, D) @ (D, D)
        gate = torch.sigmoid(self.forget(h))  # (B, T, D)
        c = h.new_zeros(h.size(0), h.size(2)) if cell is None else cell  # (B, D)
        states = []
        # a loop over T, not a scan: each position is elementwise (B, D) work, cheap beside the two maps above, and
        # the loop is the very arithmetic of a decoding step (tests/test_ssru.py checks the two are equal)
        for t in range(h.size(1)):
            c = gate[:, t] * c + (1 - gate[:, t]) * x[:, t]
            states.append(c)
        return torch.relu(torch.stack(states, dim=1)), c  # T x (B, D) -> (B, T, D)


class SSRUDecoderLayer(nn.Module):
    """The SSRU, cross-attention, the FFN (None: none), each in a residual block made by `block()`: `DecoderLayer`
    with the SSRU in place of the causal self-attention. Its step's cache is the cell state c (B, D)."""

    def __init__(self, ssru: SSRU, cross_attn: MultiHeadAttention, ffn: FeedForward | None,
                 block: Callable[[], Residual]):
        super().__init__()
        self.ssru, self.cross_attn, self.ffn = ssru, cross_attn, ffn
        self.rnn_block, self.cross_block = block(), block()
        self.ffn_block = None if ffn is None else block()

    def forward(
        self, y: torch.Tensor, memory: torch.Tensor, *, memory_mask: torch.Tensor | None, need_weights: bool = False,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """Teacher forcing: y (B, T, D) over memory (B, S, D) -> (B, T, D), {"self": None, "cross"} weights. The
        recurrence runs forward in time only, so position t reads positions <= t (right padding reads nothing
        real either: it comes after every real position)."""
        y = self.rnn_block(y, lambda h: self.ssru(h)[0], keep)
        y, cross = attend_source(self, y, memory, memory_mask=memory_mask, need_weights=need_weights, keep=keep)
        return y, {"self": None, "cross": cross}

    def step_weights(self) -> StepWeights:
        """What `step` reads: StepWeights with the SSRU where the self-attention would be."""
        norms = tuple(None if b is None else norm_function(b.norm) for b in (self.rnn_block, self.cross_block,
                                                                            self.ffn_block))
        return StepWeights(self.ssru, self.cross_attn, self.ffn, nn.Identity(), self.cross_attn.output, norms,
                           self.rnn_block.norm_first, self.rnn_block.skip)

    @staticmethod
    def step(
        w: StepWeights,
        y: torch.Tensor,
        memory: KVCache,
        *,
        memory_mask: torch.Tensor | None,
        cache: torch.Tensor | None,
        need_weights: bool = False,
        beams: int = 1,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | None], torch.Tensor]:
        """Incremental decoding: y (B, 1, D), the cell state c (B, D) (None: the first step, zeros) -> (B, 1, D),
        {"self": None, "cross"} weights, the new c. The same `residual` and sublayers as `forward`."""
        pre, (n_rnn, _, _) = w.norm_first, w.norms
        cell = cache

        def recur(h: torch.Tensor) -> torch.Tensor:
            nonlocal cell
            out, cell = w.self_attn(h, cell)
            return out

        y = residual(y, recur, n_rnn, pre, skip=w.skip)
        y, cross = step_source(w, y, memory, memory_mask=memory_mask, need_weights=need_weights, beams=beams)
        return y, {"self": None, "cross": cross}, cell
