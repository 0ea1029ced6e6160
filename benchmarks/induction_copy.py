"""Copying by content (an induction head) on a synthetic text, and whether attnkit's LM learns it when a plain
PyTorch one does. The text (layout `content`, the default) is lines of

    #key FILLER #key        e.g.  #qibzra XMWZVUATPKHXK #qibzra   (written without the spaces)

the key 6 random lowercase letters, the filler 8-40 random uppercase letters, so nothing but the first `#key` predicts
the second key, at a distance that varies from line to line: per character, no copying costs 3.10 nats and perfect
copying 2.60 (a line's length is uniform over 33 values: log 33 nats a line). Layout `offset`: lines `key|key` of 8
random lowercase letters, the copy always 9 characters back (no copying 2.90, copying 1.45 nats a character).
docs/claims.md ("Planted long-range recall") uses it to show why the planted keys are not recalled.

    python benchmarks/induction_copy.py write OUT [--layout offset] [--lines 30000] [--seed 1]   # OUT/*.txt
    attnkit lm prepare --train OUT/train.txt --valid OUT/valid.txt --test OUT/test.txt --out OUT/data
    attnkit lm train --data OUT/data --out OUT/run --config lm-char-small-vanilla-64 --train.max_steps 10000 ...
    python benchmarks/induction_copy.py oracle OUT/data [--steps 8000] [--device cuda]

`oracle` trains the `lm-char-small-vanilla-64` model and the same network written with torch.nn.TransformerEncoder
(post-LN, sinusoids, tied embeddings) in one loop, on the same batches (32 rows x 64 characters, Adam, lr 1e-3 after
100 warm-up steps, clipping at 0.25), and prints both validation losses every 250 updates.
"""

from __future__ import annotations

import argparse
import math
import random
import string
import time
from pathlib import Path

import torch
from torch import nn

from attnkit.data.planted import cut_rows

KEY_LEN, OFFSET_KEY_LEN = 6, 8
FILLER = (8, 40)
ROWS, SEGMENT, LR, WARMUP, CLIP, EVERY = 32, 64, 1e-3, 100, 0.25, 250


def line(rng: random.Random, layout: str) -> str:
    if layout == "offset":
        key = "".join(rng.choices(string.ascii_lowercase, k=OFFSET_KEY_LEN))
        return f"{key}|{key}"
    key = "".join(rng.choices(string.ascii_lowercase, k=KEY_LEN))
    filler = "".join(rng.choices(string.ascii_uppercase, k=rng.randint(*FILLER)))
    return f"#{key}{filler}#{key}"


def write(out: Path, layout: str, lines: int, seed: int) -> None:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", lines), ("valid", 400), ("test", 400)):
        text = "".join(line(rng, layout) + "\n" for _ in range(n))
        (out / f"{split}.txt").write_text(text, encoding="utf-8")


class PlainLM(nn.Module):
    """The vanilla LM written with torch.nn: scaled tied embeddings + sinusoids, post-LN encoder layers, causal."""

    def __init__(self, vocab: int, d: int, heads: int, d_ff: int, layers: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        nn.init.normal_(self.embed.weight, std=d**-0.5)
        pos = torch.arange(1024)[:, None] * torch.exp(torch.arange(0, d, 2) * (-math.log(1e4) / d))  # (1024, D/2)
        self.register_buffer("sinusoids", torch.stack([pos.sin(), pos.cos()], -1).flatten(1))  # (1024, D)
        layer = nn.TransformerEncoderLayer(d, heads, d_ff, dropout, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """x, targets (B, T) -> NLL (B * T,)."""
        t, d = x.size(1), self.embed.embedding_dim
        h = self.dropout(self.embed(x) * d**0.5 + self.sinusoids[:t])
        causal = nn.Transformer.generate_square_subsequent_mask(t, x.device)  # (T, T)
        h = self.dropout(self.layers(h, mask=causal, is_causal=True))  # (B, T, D)
        logits = h @ self.embed.weight.t()  # (B, T, V)
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")


def nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y) if isinstance(model, PlainLM) else model(x, targets=y)[0].flatten()


def rows(ids, b: int, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(cut_rows(ids, b)).to(device)  # (N,) -> (B, N / B), as the LM streams cut it


@torch.no_grad()
def valid_loss(model: nn.Module, valid: torch.Tensor) -> float:
    model.eval()
    losses = [nll(model, valid[:, i : i + SEGMENT], valid[:, i + 1 : i + 1 + SEGMENT])
              for i in range(0, valid.size(1) - 1 - SEGMENT, SEGMENT)]
    model.train()
    return torch.cat(losses).mean().item()


def oracle(data: Path, steps: int, device: torch.device) -> None:
    from attnkit import config as cfgmod
    from attnkit.data.lm import load_lm_corpus
    from attnkit.models import build_model

    corpus = load_lm_corpus(data)
    vocab = corpus.vocab.vocab_size
    train, valid = rows(corpus.arrays["train"], ROWS, device), rows(corpus.arrays["valid"], 8, device)
    m = cfgmod.resolve(["lm-char-small-vanilla-64"], [f"--model.vocab_size={vocab}"], cls=cfgmod.LMRunConfig).model
    torch.manual_seed(0)
    models = {"attnkit": build_model(m.kind, m),
              "torch.nn": PlainLM(vocab, m.d_model, m.n_heads, m.d_ff, m.n_layers, m.dropout)}
    optims = {}
    for name, model in models.items():
        model.to(device)
        optims[name] = torch.optim.Adam(model.parameters(), lr=LR)
        print(f"{name}: {sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
    segments, start = (train.size(1) - 1) // SEGMENT, time.time()
    for step in range(1, steps + 1):
        i = (step - 1) % segments * SEGMENT
        x, y = train[:, i : i + SEGMENT], train[:, i + 1 : i + 1 + SEGMENT]  # (B, T) each
        for name, model in models.items():
            for group in optims[name].param_groups:
                group["lr"] = LR * min(1.0, step / WARMUP)
            optims[name].zero_grad()
            nll(model, x, y).mean().backward()
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optims[name].step()
        if step % EVERY == 0:
            losses = " ".join(f"{name} {valid_loss(model, valid):.4f}" for name, model in models.items())
            print(f"update {step} | {time.time() - start:.0f} s | valid nats/char: {losses}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    w = verbs.add_parser("write", help="write OUT/{train,valid,test}.txt")
    w.add_argument("out", type=Path)
    w.add_argument("--layout", choices=("content", "offset"), default="content")
    w.add_argument("--lines", type=int, default=30000, help="training lines (valid and test: 400 each)")
    w.add_argument("--seed", type=int, default=1)
    o = verbs.add_parser("oracle", help="attnkit's vanilla LM and torch.nn's, one loop, the same batches")
    o.add_argument("data", type=Path, help="the folder `attnkit lm prepare` wrote from the written text")
    o.add_argument("--steps", type=int, default=8000)
    o.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.verb == "write":
        write(args.out, args.layout, args.lines, args.seed)
    else:
        oracle(args.data, args.steps, torch.device(args.device))


if __name__ == "__main__":
    main()
