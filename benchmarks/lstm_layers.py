"""The LSTM LM's layers on a CPU: `nn.LSTM`'s own multi-layer call with its dropout between layers (the model as
attnkit.models.rnn_lm builds it), against attnkit.cpu's `LayerwiseLSTM` over the same Parameters, the same cells a
layer at a time with attnkit's dropout between them (attnkit/cpu/lstm.py); both time-major.

    python benchmarks/lstm_layers.py [--batch 32] [--steps 128] [--dim 256] [--layers 4] [--dropout 0.1] [--rounds 20]

One process, the two taking turns `--rounds` times (the order swapped every round), on the same weights: the tokens
embedded, the layers, the outputs flattened to (B x T, D) as the output layer reads them, and a backward from a sum
of squares of the outputs. Printed: each one's median time (ms) and the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from attnkit.config import RNNLMConfig
from attnkit.cpu.lstm import LayerwiseLSTM
from attnkit.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build_model("lstm-lm", RNNLMConfig(vocab_size=256, d_model=a.dim, n_layers=a.layers, dropout=a.dropout))
    model.train()
    layerwise = LayerwiseLSTM.sharing(model.rnn)
    x = torch.randint(256, (a.batch, a.steps))  # (B, T)

    def through(layers: nn.Module) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:  # (B, T) -> (B x T, D)
            out, _ = layers(model.embed_tokens(x.t()))  # (T, B, D)
            return out.transpose(0, 1).reshape(-1, a.dim)
        return run

    sides = {"nn.LSTM": through(model.rnn), "LayerwiseLSTM": through(layerwise)}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(a.rounds + 2):  # the first two rounds warm up
        for name in list(sides)[:: 1 if r % 2 else -1]:
            start = time.perf_counter()
            sides[name]().square().sum().backward()
            if r >= 2:
                times[name].append(time.perf_counter() - start)
    (old, a_times), (new, b_times) = times.items()
    for name, t in times.items():
        print(f"{name}: {statistics.median(t) * 1e3:.1f} ms (median of {len(t)})")
    ratio = statistics.median(o / n for o, n in zip(a_times, b_times))
    print(f"{old} / {new}: {ratio:.3f}x (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
