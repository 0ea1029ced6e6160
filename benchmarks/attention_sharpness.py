"""How peaked each RNN row's attention is, at initialisation and as it trains: the ancestors' table explained.

Reads the rows `attnkit experiment ancestors` trained (OUT/NAME/checkpoints), rebuilds each model at
initialisation with its training seed, and teacher-forces the first N dev pairs through it, then through each kept
epoch's weights and the best ones. Per target token it records the attention's largest weight and its entropy (nats;
log S is uniform) and the spread of the raw scores before the softmax, averaged over the real tokens.

    python benchmarks/attention_sharpness.py --runs runs/ancestors --data runs/multi30k/data \
        --out benchmarks/results/ancestors/attention-sharpness.csv
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import torch

from attnkit.checkpoint import epoch_checkpoints, load_checkpoint, model_from
from attnkit.data.batching import collate
from attnkit.data.dataset import load_split
from attnkit.models import build_model
from attnkit.runtime import seed_everything

ROWS = ("bahdanau", "luong-dot", "luong-general", "luong-concat", "luong-cosine")


@torch.no_grad()
def sharpness(model: torch.nn.Module, batch) -> dict[str, float]:
    """Mean over real target tokens of the attention's max weight, its entropy and the raw scores' std."""
    model.eval()
    scores: list[torch.Tensor] = []
    hook = model._scores  # every row's scores pass through it: (B, H) x (B, S, A) -> (B, S)
    model._scores = lambda query, keys: scores.append(hook(query, keys)) or scores[-1]
    try:
        _, maps = model.attention(batch.src, batch.tgt_in)
    finally:
        del model._scores
    w = maps["cross"][0][:, 0]  # (B, T, S)
    real = ~batch.tgt_pad_mask  # (B, T)
    entropy = -(w * w.clamp_min(1e-12).log()).sum(-1)  # (B, T)
    raw = torch.stack(scores, 1)  # (B, T, S)
    src_real = (~batch.src_pad_mask)[:, None, :].expand_as(raw)
    spread = torch.stack([raw[b, t][src_real[b, t]].std() for b, t in real.nonzero().tolist()])
    return {"max_weight": w.amax(-1)[real].mean().item(), "entropy": entropy[real].mean().item(),
            "uniform_entropy": (~batch.src_pad_mask).sum(1, keepdim=True).expand_as(real)[real].float().log()
            .mean().item(), "score_std": spread.mean().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=Path("runs/ancestors"))
    ap.add_argument("--data", type=Path, default=Path("runs/multi30k/data"))
    ap.add_argument("--pairs", type=int, default=256, help="the first N dev pairs")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dev = load_split(args.data, "valid")
    batch = collate([dev.pair(i) for i in range(args.pairs)], range(args.pairs))
    rows = []
    for name in ROWS:
        run = args.runs / name
        best = run / "checkpoints" / "best.safetensors"
        cfg = load_checkpoint(best).config
        seed_everything(cfg.train.seed)
        stages = [("init", 0, build_model(cfg.model.kind, cfg.model))]
        for path in [*epoch_checkpoints(run), best]:
            ckpt = load_checkpoint(path)
            stages.append((path.stem, ckpt.train_state.get("step"), model_from(ckpt, path)))
        for stage, step, model in stages:
            rows.append({"row": name, "weights": stage, "step": step, **sharpness(model, batch)})
            print(*(f"{v:.3f}" if isinstance(v, float) else v for v in rows[-1].values()), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out} (uniform attention over these sources: {rows[0]['uniform_entropy']:.2f} nats, "
          f"max weight ~{math.exp(-rows[0]['uniform_entropy']):.3f})")


if __name__ == "__main__":
    main()
