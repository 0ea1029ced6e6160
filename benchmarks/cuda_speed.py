"""Speed on a CUDA GPU: the MT workload of ../shared/bench/WORKLOADS.md for attnkit and Hugging Face's BART (the
bench's PyTorch peer), with the peak GPU memory beside every figure.

    python benchmarks/cuda_speed.py [--json FILE]    # on a machine with a CUDA GPU (benchmarks/cuda.sh runs it)

- training: full steps (zero_grad .. Adam step, label-smoothed cross-entropy) at the workload's batch (64 x 24)
  and at a GPU-sized one (1,024 x 24 = 24,576 target tokens), float32 with TF32 products and bf16 autocast;
  5 warm-up steps, the median of 20;
- decoding: exactly 24 new tokens per source, greedy over 64 sources and beam 5 over 16 (the workload's shapes),
  and greedy over 1,024 sources; one warm-up, the median of 3.
Each figure comes from the same process, toolkits taking turns per shape; every timed call ends with a
`torch.cuda.synchronize()` (bench.measure.timed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnkit.bench.measure import timed, toolkit
from attnkit.bench.workloads import MTAdapter, MTShape, mt_batch
from attnkit.runtime import autocast, tf32_products

CUDA = torch.device("cuda")
TRAIN_BATCHES = (64, 1024)
DECODE = ((1, 64), (5, 16), (1, 1024))  # (beam, sources)


def fresh_peak() -> None:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def peak_mb() -> float:
    return torch.cuda.max_memory_allocated() / 2**20


def train(adapter: MTAdapter, s: MTShape, batch: int, dtype: str) -> dict:
    torch.manual_seed(0)
    fresh_peak()
    model = adapter.build(s).to(CUDA).train()
    src, tgt_in, tgt = (t.to(CUDA) for t in mt_batch(batch, s))  # (B, S), (B, T), (B, T)
    opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9, fused=True)

    def step() -> None:
        opt.zero_grad()
        with autocast(CUDA, dtype):
            logits = adapter.logits(model, src, tgt_in)  # (B, T, V)
        F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), tgt.reshape(-1), label_smoothing=0.1).backward()
        opt.step()

    with tf32_products(CUDA):
        sec = timed(step, s.warmup, s.steps, CUDA)
    return {"tok_s": tgt.numel() / sec, "step_ms": 1e3 * sec, "peak_mb": peak_mb()}


def decode(adapter: MTAdapter, s: MTShape, beam: int, n: int) -> dict:
    torch.manual_seed(0)
    fresh_peak()
    model = adapter.build(s).to(CUDA).eval()
    src = mt_batch(n, s)[0].to(CUDA)  # (n, S)

    def run() -> None:
        with torch.no_grad():
            out = adapter.generate(model, src, beam, s.tgt_len)  # (n, T)
        if tuple(out.shape) != (n, s.tgt_len):
            raise RuntimeError(f"generated {tuple(out.shape)}, not {(n, s.tgt_len)}")

    sec = timed(run, 1, s.decode_runs, CUDA)
    return {"tok_s": n * s.tgt_len / sec, "run_ms": 1e3 * sec, "peak_mb": peak_mb()}


def cases(s: MTShape) -> list[tuple[str, Callable[[MTAdapter], dict]]]:
    out = [(f"train {b} x {s.tgt_len} {dt}", lambda a, b=b, dt=dt: train(a, s, b, dt))
           for b in TRAIN_BATCHES for dt in ("float32", "bfloat16")]
    names = {1: "greedy", 5: "beam 5"}
    return out + [(f"{names[beam]} {n} x {s.tgt_len}", lambda a, beam=beam, n=n: decode(a, s, beam, n))
                  for beam, n in DECODE]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write every result as JSON lines here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_speed.py: no CUDA device here", file=sys.stderr)
        return 2
    s = MTShape()
    toolkits = {name: toolkit(name) for name in ("attnkit", "huggingface")}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          + ", ".join(f"{k} {tk.version}" for k, tk in toolkits.items()) + f"; shape {dataclasses.asdict(s)}\n")
    print("| case | attnkit tok/s | peak MB | HF BART tok/s | peak MB | attnkit / HF |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for label, run in cases(s):
        got = {}
        for name, tk in toolkits.items():
            try:
                got[name] = run(tk.mt)
            except Exception as e:  # a peer that cannot run a case is reported, not fatal
                got[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
        a, h = got["attnkit"], got["huggingface"]
        ratio = f"{a['tok_s'] / h['tok_s']:.2f}" if "tok_s" in a and "tok_s" in h else "-"
        cells = [f"{r['tok_s']:,.0f} | {r['peak_mb']:,.0f}" if "tok_s" in r else f"{r['error']} | -" for r in (a, h)]
        print(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |", flush=True)
        rows.append({"case": label, **{k: v for k, v in got.items()}})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
