"""Speed on a CUDA GPU: the MT workload of ../shared/bench/WORKLOADS.md for attnkit and Hugging Face's BART (the
bench's PyTorch peer), with the peak GPU memory beside every figure.

    python benchmarks/cuda_speed.py [--json FILE]    # on a machine with a CUDA GPU (benchmarks/cuda.sh runs it)

- training: the bench's full steps (bench.measure: zero_grad .. Adam step, label-smoothed cross-entropy) at the
  workload's batch (64 x 24) and at a GPU-sized one (1,024 x 24 = 24,576 target tokens), float32 with TF32
  products and bf16 autocast; 5 warm-up steps, the median of 20;
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
from dataclasses import replace

import torch

from attnkit.bench.measure import mt_decode, mt_train_case, toolkit, train_throughput
from attnkit.bench.workloads import MTAdapter, MTShape
from attnkit.cpu import training_kernels

CUDA = torch.device("cuda")
TRAIN_BATCHES = (64, 1024)
DECODE = ((1, 64), (5, 16), (1, 1024))  # (beam, sources)


def fresh_peak() -> None:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def peak_mb() -> float:
    return torch.cuda.max_memory_allocated() / 2**20


def train(adapter: MTAdapter, s: MTShape, batch: int, dtype: str) -> dict:
    """The bench's training step (bench.measure) on the GPU at `batch` pairs, on the kernels attnkit trains with
    (attnkit.cpu.training_kernels: TF32 products, attention without cuDNN's per-shape plans)."""
    torch.manual_seed(0)
    fresh_peak()
    with training_kernels(CUDA):
        got = train_throughput(mt_train_case(adapter, replace(s, train_batch=batch), CUDA), s.warmup, dtype)
    return {"tok_s": got["tok_s"], "step_ms": 1e3 * got["step_s"], "peak_mb": peak_mb()}


def decode(adapter: MTAdapter, s: MTShape, beam: int, n: int) -> dict:
    """The bench's decoding (bench.measure) on the GPU over `n` sources."""
    torch.manual_seed(0)
    fresh_peak()
    got = mt_decode(adapter, replace(s, greedy_batch=n) if beam == 1 else replace(s, beam_batch=n), beam, device=CUDA)
    return {"tok_s": got["tok_s"], "run_ms": 1e3 * got["run_s"], "peak_mb": peak_mb()}


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
