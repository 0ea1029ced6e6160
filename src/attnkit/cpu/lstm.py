"""An LSTM whose layers run one at a time, for training on a CPU.

T time steps, B batch, I input size, H hidden size, L layers.

`nn.LSTM`'s multi-layer call on a CPU transposes its input and output around oneDNN's cells and draws the dropout
between layers with `bernoulli_`. `LayerwiseLSTM` runs the same cells a layer at a time (`torch.lstm` over one
layer's weights, time-major), with attnkit's dropout between them (attnkit.cpu.dropout: a cheaper mask, the same
rate); `python benchmarks/lstm_layers.py` times forward and backward both ways. It is an `nn.LSTM` with the same
parameters under the same names, so `LayerwiseLSTM.sharing(lstm)` can stand in for a model's LSTM without copying
a weight or changing its state dict. Elsewhere (cuDNN wants its weights in one flat buffer) `nn.LSTM`'s own call is
the one to use. tests/test_cpu_lstm.py checks outputs, states and gradients against `nn.LSTM`, and the dropout's rate.

`torch.lstm` is private: tests/test_private_torch.py checks its positional signature against `nn.LSTM`.
"""

from __future__ import annotations

import torch
from torch import nn

from attnkit.cpu.dropout import dropout


class LayerwiseLSTM(nn.LSTM):
    """`nn.LSTM` (unidirectional, time-major, no projection) computed a layer at a time (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.bidirectional or self.batch_first or self.proj_size:
            raise ValueError(f"LayerwiseLSTM: a unidirectional, time-major LSTM without projection, not "
                             f"bidirectional={self.bidirectional}, batch_first={self.batch_first}, "
                             f"proj_size={self.proj_size}")

    @classmethod
    def sharing(cls, lstm: nn.LSTM) -> LayerwiseLSTM:
        """A LayerwiseLSTM over `lstm`'s own Parameters (the same objects, nothing copied), in its training mode."""
        # built on the meta device, so the Parameters it makes take no memory before `lstm`'s replace them
        new = cls(lstm.input_size, lstm.hidden_size, lstm.num_layers, bias=lstm.bias, batch_first=lstm.batch_first,
                  dropout=lstm.dropout, bidirectional=lstm.bidirectional, proj_size=lstm.proj_size, device="meta")
        for name, p in lstm.named_parameters():  # nn.LSTM's __setattr__ keeps its list of weights in step
            setattr(new, name, p)
        return new.train(lstm.training)

    def forward(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x (T, B, I), hx (h, c) (L, B, H) each or None (zeros) -> the last layer's outputs (T, B, H) and the final
        state (h, c) (L, B, H) each, as `nn.LSTM` returns them."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(f"LayerwiseLSTM: input must be a (T, B, I) tensor, not {_described(x)}")
        if hx is None:
            zeros = x.new_zeros(self.num_layers, x.size(1), self.hidden_size)  # (L, B, H)
            hx = (zeros, zeros)
        finals = []
        for i, weights in enumerate(self.all_weights):  # [W_ih, W_hh(, b_ih, b_hh)] of layer i
            if i:
                x = dropout(x, self.dropout, self.training)
            # (T, B, H) and its final (1, B, H) x 2; args: biases, 1 layer, no dropout, train, one direction, time-major
            x, *final = torch.lstm(x, (hx[0][i : i + 1], hx[1][i : i + 1]), weights, self.bias, 1, 0.0,
                                   self.training, False, False)
            finals.append(final)
        h_n, c_n = (torch.cat(f) for f in zip(*finals))  # (L, B, H) each
        return x, (h_n, c_n)


def _described(x: object) -> str:
    return f"a {x.dim()}-d tensor" if isinstance(x, torch.Tensor) else type(x).__name__
