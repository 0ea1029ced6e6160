"""Where a decoding run's time goes, at the MT workload's shape and at Transformer-base, float32 and int8.

    python benchmarks/decode_profile.py [--shapes mt base] [--searches greedy beam5] [--threads 2]

Runs the bench's own decoding (`attnkit.bench.attnkit_adapter`: exactly 24 new tokens, EOS blocked) once to
warm up, then once under torch.profiler, and splits the wall time into the operators' own CPU time by kind:
GEMMs (every linear map, output projection included), attention (score and value products, softmax,
masks), normalisation and residual adds, the search itself (log-softmax over the vocabulary, top-k,
reordering the cache), copies, and the rest: time spent in Python and dispatch between the products
(wall time minus the operators' time). One markdown table on stdout.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from attnkit.bench.attnkit_adapter import attnkit_mt_build, attnkit_mt_generate
from attnkit.bench.workloads import MT_BASE, MTShape, mt_batch

SHAPES = {"mt": MTShape(), "base": MT_BASE}
KINDS = {  # operator name -> kind; the first matching prefix wins
    "mkldnn::_linear_pointwise": "GEMMs", "quantized::linear": "GEMMs", "aten::addmm": "GEMMs",
    "aten::mm": "GEMMs", "aten::linear": "GEMMs",
    "aten::bmm": "attention", "aten::baddbmm": "attention", "aten::_softmax": "attention",
    "aten::_scaled_dot_product": "attention", "aten::masked_fill": "attention",
    "aten::native_layer_norm": "norm + residual", "aten::add": "norm + residual",
    "aten::_log_softmax": "search", "aten::topk": "search", "aten::argmax": "search", "aten::amax": "search",
    "aten::index": "search", "aten::gather": "search", "aten::sort": "search",
    "aten::copy_": "copies", "aten::cat": "copies", "aten::clone": "copies",
}
COLUMNS = ["GEMMs", "attention", "norm + residual", "search", "copies", "other ops", "Python + dispatch"]


def kind(name: str) -> str:
    return next((k for prefix, k in KINDS.items() if name.startswith(prefix)), "other ops")


def split(shape: MTShape, beam: int, int8: bool) -> tuple[float, dict[str, float]]:
    """(wall seconds, seconds per kind) of one profiled run."""
    model = attnkit_mt_build(shape).eval()
    src, _, _ = mt_batch(shape.greedy_batch if beam == 1 else shape.beam_batch, shape)  # (B, S)
    with torch.no_grad():
        attnkit_mt_generate(model, src, beam, shape.tgt_len, int8)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            attnkit_mt_generate(model, src, beam, shape.tgt_len, int8)
            wall = time.perf_counter() - start
    seconds = dict.fromkeys(COLUMNS, 0.0)
    for event in prof.key_averages():
        seconds[kind(event.key)] += event.self_cpu_time_total / 1e6
    seconds["Python + dispatch"] = max(0.0, wall - sum(seconds.values()))
    return wall, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--searches", nargs="+", default=["greedy", "beam5"], choices=["greedy", "beam5"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("| shape | search | weights | tok/s (profiled) | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|---:|" + "---:|" * len(COLUMNS))
    for name in args.shapes:
        shape = SHAPES[name]
        for search in args.searches:
            beam = 1 if search == "greedy" else shape.beam
            n = shape.greedy_batch if beam == 1 else shape.beam_batch
            for int8 in (False, True):
                wall, seconds = split(shape, beam, int8)
                shares = " | ".join(f"{100 * seconds[c] / wall:.0f}%" for c in COLUMNS)
                print(f"| {name} | {search} | {'int8' if int8 else 'float32'} | {n * shape.tgt_len / wall:,.0f} | "
                      f"{shares} |", flush=True)


if __name__ == "__main__":
    main()
